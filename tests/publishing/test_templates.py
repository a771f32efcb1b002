"""The text templates: report.md.j2 renders the report's prose and pandas tables; model_card.md words each phase."""

import re

import jinja2
import numpy as np
import pytest

from twotower.evaluation import compute_preference
from twotower.evaluation.scoring import report
from twotower.evaluation.publishing.model_card import CARD_FUNCTIONS, model_card_template, phase_config
from twotower.training.arguments import TwoTowerTrainingConfig
from twotower.training.optim.optimization import adamw_description
from twotower.training.phases import make_phase


MIN_COUNT = 5
NUM_TYPES = 40


def two_tower_result(seed=0):
    """A preference result of 2 towers over NUM_TYPES token types, tower 0 better on the even ones."""
    rng = np.random.default_rng(seed)
    token_ids = np.repeat(np.arange(NUM_TYPES), rng.integers(8, 20, NUM_TYPES))
    gold_logprobs = -rng.uniform(2.0, 6.0, (2, token_ids.shape[0]))
    gold_logprobs[1] -= np.where(token_ids % 2 == 0, 0.5, -0.5)
    return compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, top_k=3)


def rendered_report(result, settings):
    metadata = {
        "model": {"path": "planted", "tower_type": "lstm", "cooperative": False},
        "data": {"description": "planted predictions", "num_blocks": 3, "block_size": 32},
        "settings": settings,
        "perplexity": {"joint": 12.345, "probes": [20.0, 21.5]},
        "summary": result.summary,
    }
    tokens = [f"tok|{token_id}" for token_id in result.token_ids]
    return report.render_markdown(metadata, report.per_token_table(result, tokens))


def test_report_template_renders_prose_and_pandas_tables():
    result = two_tower_result()
    summary = result.summary
    markdown = rendered_report(result, {"objective": "masked", "masking": "every token once"})

    assert markdown.startswith("# Tower preference report\n\nModel: `planted` (2 towers). Data: planted predictions")
    assert markdown.endswith(" |\n") and "\n\n\n" not in markdown
    objective = "Objective: masked LM (lstm towers, independent-towers control (no cooperation)). Masking: every"
    assert objective in markdown
    assert re.search(r"\| joint model +\| 12\.35 +\|", markdown)
    assert re.search(r"\| probe of tower 1 +\| 21\.50 +\|", markdown)
    offsets = ", ".join(f"tower {t} {value:+.3f}" for t, value in enumerate(summary["global_offset_nats"]))
    assert f"probes' log perplexities): {offsets} nats; the preferences below are raw" in markdown
    assert f"Token types seen at least {MIN_COUNT} times are eligible ({summary['num_eligible_types']};" in markdown
    assert "tower 0's mean log-probability minus tower 1's" in markdown
    assert "- split-half consistency (correlation" in markdown and "Tower or probe?" not in markdown
    # the top tokens table: a pipe inside a token is escaped, the figures are the summary's
    top_token, top_nats = summary["top_token_ids"][0][0], summary["top_preference_nats"][0][0]
    assert re.search(rf"\| `tok\\\|{top_token}` +\| {top_token} +\| \d+ +\| {top_nats:.3f} +\|", markdown)
    header = r"^\| token +\| id +\| count +\| preference \(nats\) +\| p-value +\| significant over occurrences +\|$"
    # per tower, the top types significant over occurrences, then apart the others; every row says which it is
    for tower, top_ids in enumerate(summary["top_token_ids"]):
        section = markdown.split(f"## Top tokens of tower {tower}\n")[1].split("\n## ")[0]
        passing = sum(bool(result.significant[list(result.token_ids).index(i)]) for i in top_ids)
        assert section.startswith(f"\n{passing} of the {len(top_ids)} strongest types are significant over")
        assert len(re.findall(header, section, re.M)) == (passing > 0) + (passing < len(top_ids))
        assert len(re.findall(r"\| yes +\|$", section, re.M)) == passing
        assert len(re.findall(r"\| no +\|$", section, re.M)) == len(top_ids) - passing


def test_report_without_an_objective_has_no_objective_line():
    markdown = rendered_report(two_tower_result(1), {})
    assert "Objective:" not in markdown and "\n\n## Perplexity\n\n| model " in markdown


def test_report_template_fails_loudly_on_a_missing_figure():
    result = two_tower_result()
    del result.summary["num_excluded_types"]
    with pytest.raises(jinja2.UndefinedError, match="num_excluded_types"):
        rendered_report(result, {})


def card_phase_text(config):
    """The Training section the model card template writes for one phase config."""
    template = jinja2.Template(model_card_template().read_text(encoding="utf-8"))
    family = {"objective": "causal", "tower_type": "transformer", "cooperative": True}
    architecture = {"num_parameters": 0, "num_probe_parameters": 0}
    card = template.render(phases=[phase_config(config)], family=family, architecture=architecture, hardware=None,
                           **CARD_FUNCTIONS)
    return card.split("## Training\n\n", 1)[1].split("\n\n## Evaluation", 1)[0]


PRETRAIN = dict(
    phase="pretrain", train_file="/home/me/data/wikitext-2/train.txt", validation_file="/home/me/valid.txt",
    block_size=128, max_train_blocks=12000, tokenizer_vocab_size=8000, max_train_steps=2500,
    per_device_train_batch_size=16, gradient_accumulation_steps=2, learning_rate=3e-4, adam_beta1=0.9,
    adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.1, max_grad_norm=1.0, lr_scheduler_type="cosine",
    num_warmup_steps=1200, seed=42, cpu=True,
)  # fmt: skip
PRETRAIN["optimizer"] = adamw_description(TwoTowerTrainingConfig(**PRETRAIN))  # the run's record


def test_card_template_words_a_pretrain_phase():
    text = card_phase_text(PRETRAIN)
    assert text.startswith(
        "**Phase `pretrain`**: the joint model (the paper's phase 1): every weight trained on the next-token loss "
        "of the fused logits.\n"
    )
    rows = dict(re.findall(r"^\| (\w+) \| (.*) \|$", text, flags=re.M))
    assert rows == {
        "Data": "local text `wikitext-2/train.txt` (validation `me/valid.txt`), blocks of 128 tokens, the first "
        "12,000 training blocks",
        "Tokenizer": "byte-level BPE of 8,000 tokens trained on the training text",
        "Length": "2,500 optimizer steps",
        "Batch": "16 sequences of 128 tokens per device x 2 accumulation step(s) per optimizer step, times the "
        "number of processes",
        "Optimizer": "AdamW, learning rate 0.0003, betas (0.9, 0.95), eps 1e-08, weight decay 0.1 (not on norms "
        "and biases), gradient clipping 1",
        "Schedule": "cosine, 1,200 warm-up steps",
        "Precision": "not recorded (trained before runs recorded it)",
        "Seed": "42",
    }
    assert "\n\nHardware: not recorded by the training run.\n" in text


def test_card_template_words_a_probe_phase_on_a_hub_dataset():
    probe = {
        **PRETRAIN, "phase": "probe", "train_file": None, "validation_file": None, "dataset_name": "wikitext",
        "dataset_config_name": "wikitext-103-raw-v1", "max_train_blocks": None, "max_train_steps": None,
        "num_train_epochs": 1, "weight_decay_exclude": "none", "mixed_precision": "bf16",
    }  # fmt: skip
    linear = TwoTowerTrainingConfig(phase="probe", pretrained_model="unused", probe_type="linear", max_train_steps=50)
    probe["optimizer"] = make_phase(linear).optimizer_description  # the run's record
    text = card_phase_text(probe)
    assert text.startswith("**Phase `probe`**: the joint model frozen; probes (one or more replicas per tower)")
    assert "| Data | the Hub dataset `wikitext` (`wikitext-103-raw-v1`), blocks of 128 tokens |" in text
    assert "| Tokenizer | the pretrained model's |" in text and "| Length | 1 epoch |" in text
    assert ("| Optimizer | L-BFGS (strong-Wolfe line search, history 10, lr 1, no schedule), one iteration a step on "
            "the full batch, L2 penalty 0.001 on weights and biases, stopping when no gradient entry exceeds 0.0001 |"
            ) in text
    assert "| Precision | bf16 |" in text
    # the precision the run recorded (`accelerate launch --mixed_precision` sets it where the option did not)
    assert "| Precision | bf16 mixed precision |" in card_phase_text({**probe, "precision": "bf16", "mixed_precision": None})
    assert "| Precision | fp32 |" in card_phase_text({**probe, "precision": "no"})
