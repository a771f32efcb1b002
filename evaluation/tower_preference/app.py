"""The Gradio app of the tower_preference Space: paste token ids and gold log-probabilities, read the metric."""

import json
from pathlib import Path

import evaluate
import gradio as gr


# load the script beside this file (a Space's folder is not named after the metric); in memory: no cache files
module = evaluate.load(str(Path(__file__).with_name("tower_preference.py")), keep_in_memory=True)
EXAMPLE_TOKEN_IDS = "[11, 12, 11, 12, 11, 12]"
EXAMPLE_GOLD_LOGPROBS = "[[-1.0, -2.0], [-3.0, -1.0], [-1.2, -2.1], [-3.1, -0.8], [-0.9, -2.2], [-2.9, -1.1]]"


def compute(token_ids, gold_logprobs, min_count):
    """The metric's results for pasted JSON lists; a bad input shows the metric's own message."""
    try:
        return module.compute(
            token_ids=json.loads(token_ids), gold_logprobs=json.loads(gold_logprobs), min_count=int(min_count)
        )
    except ValueError as error:  # json.JSONDecodeError is one too
        raise gr.Error(str(error)) from error


demo = gr.Interface(
    fn=compute,
    inputs=[
        gr.Textbox(label="token_ids: JSON list of gold token ids", value=EXAMPLE_TOKEN_IDS),
        gr.Textbox(
            label="gold_logprobs: JSON list, per prediction one log-probability per tower", value=EXAMPLE_GOLD_LOGPROBS
        ),
        gr.Number(label="min_count", value=3, precision=0),
    ],
    outputs=gr.JSON(label="tower_preference"),
    title="Metric: tower_preference",
    description=module.info.description,
)
demo.launch()
