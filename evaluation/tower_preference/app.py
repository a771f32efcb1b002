"""
The Gradio app of the tower_preference Space: paste token ids and gold log-probabilities and read the metric, or give
a twotower model and a short text and read the metric next to the token view of that text.

A Space runs it as a script (`python app.py`); the tests import it and launch `demo` on 127.0.0.1.
"""

import argparse
import html
import json
import os
from pathlib import Path

import evaluate
import gradio as gr
import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

import modeling_twotower  # noqa: F401 (registers the twotower classes: the model code is this copy, never a repo's)
from model_source import MAX_DOWNLOAD_VARIABLE, MODEL_DIR_VARIABLE, ModelSourceError, served_model_path, visitor_message
from token_kinds import (
    after_whitespace_counts, detect_scheme, ends_in_whitespace, letter_case, token_kind, word_start_types,
)
from measures import PROBE_FREE_MEASURES
from preference_measure import intervention_summary
from text_cells import is_byte_level, with_cells
from token_view import render_token_view


# load the script beside this file (a Space's folder is not named after the metric); in memory: no cache files
module = evaluate.load(str(Path(__file__).with_name("tower_preference.py")), keep_in_memory=True)
EXAMPLE_TOKEN_IDS = "[11, 12, 11, 12, 11, 12]"
EXAMPLE_GOLD_LOGPROBS = "[[-1.0, -2.0], [-3.0, -1.0], [-1.2, -2.1], [-3.1, -0.8], [-0.9, -2.2], [-2.9, -1.1]]"
MAX_TEXT_TOKENS = 2048  # a short text: the Space scores it on a CPU while the user waits
VIEW_HEIGHT_PX = 640


def compute(token_ids, gold_logprobs, min_count):
    """The metric's results for pasted JSON lists; a bad input shows the metric's own message."""
    try:
        return module.compute(
            token_ids=json.loads(token_ids), gold_logprobs=json.loads(gold_logprobs), min_count=int(min_count)
        )
    except ValueError as error:  # json.JSONDecodeError is one too
        raise gr.Error(str(error)) from error


def load_model(model_name_or_path):
    """A twotower model (a local folder or a Hub id) and its tokenizer; one that needs masking passes is refused."""
    try:
        # the registered classes (this folder's copy of the model code) load it: a repository's own code never runs
        config = AutoConfig.from_pretrained(model_name_or_path, trust_remote_code=False)
    except (OSError, ValueError) as error:
        raise gr.Error(f"{model_name_or_path!r} is not a model folder or Hub model id one can load: {error}") from error
    if config.model_type != modeling_twotower.TwoTowerConfig.model_type:
        raise gr.Error(f"{model_name_or_path!r} holds a {config.model_type!r} model; give a twotower model.")
    is_masked = "TwoTowerForMaskedLM" in (config.architectures or [])
    auto_class = AutoModelForMaskedLM if is_masked else AutoModelForCausalLM
    model = auto_class.from_pretrained(model_name_or_path, trust_remote_code=False).eval()
    if is_masked and model.model.towers.sees_predicted_token:
        raise gr.Error(
            f"{model_name_or_path!r} is a masked LM whose towers see the token they predict, so it is scored in "
            "masking passes: score it with `python -m twotower.evaluation.scoring.score`, whose report's tokens.html is "
            "this view."
        )
    return model, AutoTokenizer.from_pretrained(model_name_or_path, trust_remote_code=False)


@torch.inference_mode()
def text_passages(model, tokenizer, text):
    """The text in blocks of the model's positions, each with every probe's gold log-probability [probes, seq]."""
    token_ids = tokenizer(text, verbose=False)["input_ids"]  # blocks of the model's positions, below
    if not 2 <= len(token_ids) <= MAX_TEXT_TOKENS:
        raise gr.Error(f"The text has {len(token_ids)} tokens; give between 2 and {MAX_TEXT_TOKENS}.")
    block_size = model.config.max_position_embeddings
    passages = []
    for start in range(0, len(token_ids), block_size):
        block = torch.tensor([token_ids[start : start + block_size]])  # [1, seq]
        # unmasked: the causal LM's next token, or every token of towers that never read the one they predict
        gold = model.probe_logprobs(block, labels=block, all_replicas=True).flatten(0, 1)[:, 0]  # [probes, seq - shift]
        gold = torch.nn.functional.pad(gold, (model.target_shift, 0), value=float("nan"))  # the first: not predicted
        ids = block[0].tolist()
        passages.append({"token_ids": ids, "gold_logprobs": gold.numpy()})
    return with_cells(tokenizer, passages)  # the text by character spans


def probe_free_measures(model, passages, token_ids, results, min_count):
    """
    ({name: result dict}, {name: summary}) of every registered probe-free measure the text allows, through the same
    metric: each tower's increase in place of its log-probability, less the largest at each position (the
    differences between towers, hence the test, unchanged); the summary is what preference.json keeps of it.
    """
    measured, mean_increases = {}, {}
    for measure in PROBE_FREE_MEASURES:
        increases = measure.space_values(model, passages)  # [towers, n], or None
        if increases is not None:
            gold = (increases - increases.max(axis=0)).T.tolist()
            measured[measure.name] = module.compute(token_ids=token_ids.tolist(), gold_logprobs=gold,
                                                    min_count=int(min_count))
            mean_increases[measure.name] = increases.mean(axis=1).tolist()
    summaries = {
        name: intervention_summary(result, result["preference_nats"], results["preference_nats"], results["eligible"],
                                   mean_increases[name],
                                   {other: measured[other]["preference_nats"] for other in measured if other != name})
        for name, result in measured.items()
    }
    return measured, summaries


def type_categories(tokens, token_ids, tokenizer, passages):
    """The kind and letter case of every type (`tokens`, the strings of `token_ids`; twotower's token categories), a
    piece that mostly follows whitespace in the passages counted as word-initial; none for other tokenizers."""
    try:
        scheme = detect_scheme(tokenizer.get_vocab())
    except ValueError:
        return {}
    special_tokens = tokenizer.all_special_tokens
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    ends_with_whitespace = np.array([ends_in_whitespace(token, scheme) for token in vocabulary], bool)
    word_starts = word_start_types(*after_whitespace_counts([p["token_ids"] for p in passages], ends_with_whitespace))
    return {
        "kind": [token_kind(token, scheme, special_tokens, token_id in word_starts)
                 for token, token_id in zip(tokens, token_ids)],
        "case": [letter_case(token, scheme) for token in tokens],
    }


def score_text(model_name_or_path, text, min_count):
    """
    The token view of `text` (in a frame: the page keeps its own script and style) and the metric's results. Every
    refusal names the model as the visitor gave it, never a path of the server (model_source.visitor_message).
    """
    try:  # a Hub id or a folder under the model directory; no other path is opened
        model_path = served_model_path(model_name_or_path)
    except ModelSourceError as error:
        raise gr.Error(str(error)) from error
    try:
        return scored_text_view(model_name_or_path, model_path, text, min_count)
    except (gr.Error, ValueError, OSError) as error:  # a model that does not load (a checkpoint error), a bad input
        message = error.message if isinstance(error, gr.Error) else str(error)
        # the modal renders HTML: the message shows as written
        raise gr.Error(html.escape(visitor_message(message, model_path, model_name_or_path.strip()))) from error


def scored_text_view(model_name_or_path, model_path, text, min_count):
    """score_text for the served folder `model_path` of the model field `model_name_or_path`."""
    model, tokenizer = load_model(model_path)
    passages = text_passages(model, tokenizer, text)
    scored = [np.isfinite(passage["gold_logprobs"][0]) for passage in passages]
    token_ids = np.concatenate([np.asarray(p["token_ids"])[mask] for p, mask in zip(passages, scored)])
    gold_logprobs = np.concatenate([p["gold_logprobs"][:, mask] for p, mask in zip(passages, scored)], axis=1)
    replicas = model.config.probe_replicas
    probe_layout = {}
    if replicas > 1:  # replica r of every tower was trained on one data order: paired, as the scoring command does
        towers = model.config.num_towers
        probe_layout = {"probe_towers": np.repeat(np.arange(towers), replicas).tolist(),
                        "probe_runs": np.tile(np.arange(replicas), towers).tolist()}  # fmt: skip
    folder = Path(model_path)
    try:
        results = module.compute(
            token_ids=token_ids.tolist(), gold_logprobs=gold_logprobs.T.tolist(), min_count=int(min_count),
            model_config=folder if folder.is_dir() else model.config, **probe_layout,
        )  # fmt: skip
    except ValueError as error:
        raise gr.Error(str(error)) from error
    measured, summaries = probe_free_measures(model, passages, token_ids, results, min_count)
    tokens = tokenizer.convert_ids_to_tokens(results["token_ids"])
    source = f"{model_name_or_path.strip()} on the given text."
    categories = type_categories(tokens, results["token_ids"], tokenizer, passages)
    page = render_token_view(results, tokens, passages, categories, source=source, measures=measured,
                             byte_level=is_byte_level(tokenizer))
    frame = (
        f'<iframe title="token view" srcdoc="{html.escape(page, quote=True)}" '
        f'style="width: 100%; height: {VIEW_HEIGHT_PX}px; border: 0"></iframe>'
    )
    return frame, results | summaries  # the metric's keys, and each probe-free measure's summary under its name


paste_tab = gr.Interface(
    fn=compute,
    inputs=[
        gr.Textbox(label="token_ids: JSON list of gold token ids", value=EXAMPLE_TOKEN_IDS),
        gr.Textbox(
            label="gold_logprobs: JSON list, per prediction one log-probability per tower", value=EXAMPLE_GOLD_LOGPROBS
        ),
        gr.Number(label="min_count", value=3, precision=0),
    ],
    outputs=gr.JSON(label="tower_preference"),
    description=module.info.description,
)
model_tab = gr.Interface(
    fn=score_text,
    inputs=[
        gr.Textbox(label="model: a twotower model with trained probes (a local folder or a Hub model id)"),
        gr.Textbox(label="text: a short text to score", lines=6),
        gr.Number(label="min_count", value=2, precision=0),
    ],
    # open: every level shown (each probe-free measure's agreement with the others lies four levels deep)
    outputs=[gr.HTML(label="token view"), gr.JSON(label="tower_preference", open=True)],
    description="Each token coloured by the tower its type prefers in this text; hover a token for its numbers.",
)
demo = gr.TabbedInterface(
    [paste_tab, model_tab], ["Token ids and log-probabilities", "A model and a text"], title="Metric: tower_preference"
)

if __name__ == "__main__":
    launch_options = argparse.ArgumentParser(description="The tower_preference Space.")
    launch_options.add_argument("--model_dir", help="serve the model folders under this directory too (default: Hub "
                                "models only)")
    launch_options.add_argument("--max_download_gb", type=float, help="the largest Hub model downloaded (default 2)")
    launched = launch_options.parse_args()
    for variable, value in ((MODEL_DIR_VARIABLE, launched.model_dir),
                            (MAX_DOWNLOAD_VARIABLE, launched.max_download_gb)):
        if value is not None:
            os.environ[variable] = str(value)
    demo.launch()
