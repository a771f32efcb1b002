"""A saved two-tower model evaluates through lm-evaluation-harness's `hf` model type, offline."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import GPT2TokenizerFast

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from twotower.evaluation.lm_eval_wikitext import TASK_NAME, split_articles, write_wikitext_task
from conftest import HANG_LIMIT_S

pytestmark = pytest.mark.slow  # launches processes or trains several models: `-m "not slow"` skips it

pytest.importorskip("lm_eval")

ARTICLE = " = Tower = \n \n The tower is tall . It was built in 1889 and stands in Paris . \n"


def test_split_articles_keeps_subheadings_inside_their_article(shared_data):
    text = " \n = First = \n text \n = = Section = = \n more \n = Second = \n other \n"
    assert split_articles(text) == [" \n = First = \n text \n = = Section = = \n more \n", " = Second = \n other \n"]
    articles = split_articles((shared_data / "wikitext-2" / "test.txt").read_text(encoding="utf-8"))
    assert len(articles) == 62 and articles[0].startswith(" \n = Robert <unk> = \n")


def test_missing_wikitext_folder_raises_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="pass the folder holding WikiText-2's test.txt"):
        write_wikitext_task(str(tmp_path / "nowhere"), str(tmp_path / "tasks"))


def test_harness_word_perplexity_equals_the_models_own_log_likelihood(tmp_path, gpt2_tokenizer_dir):
    (tmp_path / "wikitext").mkdir()
    (tmp_path / "wikitext" / "test.txt").write_text(ARTICLE, encoding="utf-8")
    write_wikitext_task(str(tmp_path / "wikitext"), str(tmp_path / "tasks"))

    tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir)
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset(
        "tiny", vocab_size=50304, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id
    )
    model = TwoTowerForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")

    command = [
        sys.executable, "-m", "lm_eval", "--model", "hf",
        "--model_args", f"pretrained={tmp_path / 'model'},trust_remote_code=True",
        "--tasks", TASK_NAME, "--include_path", str(tmp_path / "tasks"),
        "--device", "cpu", "--batch_size", "1", "--output_path", str(tmp_path / "results"),
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    (results_file,) = (tmp_path / "results").rglob("results_*.json")
    word_perplexity = json.loads(results_file.read_text())["results"][TASK_NAME]["word_perplexity,none"]

    # The document fits one window: the harness scores every token given the end-of-text token and its prefix.
    input_ids = torch.tensor([[tokenizer.eos_token_id, *tokenizer(ARTICLE).input_ids]])
    with torch.no_grad():
        log_probs = model(input_ids).logits[0, :-1].log_softmax(-1)
    log_likelihood = log_probs.gather(-1, input_ids[0, 1:, None]).sum().item()
    num_words = len(re.split(r"\s+", ARTICLE))  # the harness's wikitext word count, empty edge pieces included
    assert word_perplexity == pytest.approx(math.exp(-log_likelihood / num_words), rel=1e-4)
