"""Every model family through the whole pipeline: pretrain, probe, score, Hub card, on a slice of WikiText-2.

The families: the BERT-style masked LM (the paper's main model), the ELMo-style bidirectional LSTM, the causal
LSTM, and the independent-towers control. Each is trained for a few steps at tiny sizes, so the suite stays fast.
"""

import dataclasses
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.evaluation.scoring.score import score_model
from twotower.training.arguments import TwoTowerTrainingConfig
from twotower.training.data.blocks import load_raw_datasets, tokenize_and_group
from twotower.training.data.objectives import SeededMaskingCollator
from twotower.evaluation.publishing.publish import render_model_card, stage_model_repo
from twotower.training.launch.throughput import flops_per_token
from twotower.training.data.tokenizer import load_tokenizer, train_bpe_tokenizer
from twotower.training.train import training_function
from conftest import HANG_LIMIT_S

BLOCK_SIZE = 32
SCORED_BLOCKS = 6
MASK_PASSES = 7
TRAINING = dict(
    block_size=BLOCK_SIZE, max_train_blocks=64, max_eval_blocks=8, per_device_train_batch_size=8,
    per_device_eval_batch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
    learning_rate=3e-3, num_warmup_steps=1, cpu=True, report_to="none", disable_tqdm=True, peak_tflops=1.0,
    logging_steps=100,
)  # fmt: skip
# 64 blocks / 8 = 8 steps per epoch: 12 steps cross into epoch 1, whose masks differ from epoch 0's.
PRETRAIN_STEPS, CHECKPOINT_STEPS, PROBE_STEPS = 12, 5, 8
VARIANTS = {
    "masked": dict(objective="masked"),
    "elmo": dict(objective="masked", tower_type="lstm", lstm_hidden_size=48),
    "lstm_causal": dict(tower_type="lstm", lstm_hidden_size=48),
    "control": dict(cooperative=False),
}
MODEL_CLASSES = {"masked": TwoTowerForMaskedLM, "elmo": TwoTowerForMaskedLM, "lstm_causal": TwoTowerForCausalLM,
                 "control": TwoTowerForCausalLM}  # fmt: skip


@pytest.fixture(scope="session")
def corpus(tmp_path_factory, shared_data) -> dict:
    """60 kB of WikiText-2 train and 15 kB of validation, and a BPE with <mask> trained on the slice."""
    folder = tmp_path_factory.mktemp("wikitext-2-variants")
    for split, size in (("train", 60_000), ("valid", 15_000)):
        text = (shared_data / "wikitext-2" / f"{split}.txt").read_text(encoding="utf-8")[:size]
        (folder / f"{split}.txt").write_text(text, encoding="utf-8")
    lines = (folder / "train.txt").read_text(encoding="utf-8").splitlines()
    train_bpe_tokenizer(iter([lines]), 400, masked=True).save_pretrained(folder / "tokenizer")
    return {"train_file": str(folder / "train.txt"), "validation_file": str(folder / "valid.txt"),
            "tokenizer": str(folder / "tokenizer")}  # fmt: skip


def pretrain_config(variant: str, corpus: dict, output_dir: Path, **overrides) -> TwoTowerTrainingConfig:
    # The masked run trains its own BPE (the command must add <mask>); the others share the slice's tokenizer.
    tokenizer = dict(tokenizer_name_or_path=corpus["tokenizer"])
    if variant == "masked":
        tokenizer = dict(tokenizer_vocab_size=400)
    return TwoTowerTrainingConfig(
        phase="pretrain", output_dir=str(output_dir), train_file=corpus["train_file"],
        validation_file=corpus["validation_file"], max_train_steps=PRETRAIN_STEPS, checkpointing_steps=CHECKPOINT_STEPS,
        **tokenizer, **VARIANTS[variant], **TRAINING, **overrides,
    )  # fmt: skip


@pytest.fixture(scope="session", params=list(VARIANTS))
def pipeline_run(request, corpus, tmp_path_factory) -> dict:
    """Pretrain, probe and score one family; returns the configs, the runs' results and the report."""
    variant = request.param
    root = tmp_path_factory.mktemp(variant)
    config = pretrain_config(variant, corpus, root / "pretrain")
    pretrain = training_function(config)
    probe = training_function(
        TwoTowerTrainingConfig(
            phase="probe", pretrained_model=pretrain["model_dir"], output_dir=str(root / "probe"),
            train_file=corpus["train_file"], validation_file=corpus["validation_file"], max_train_steps=PROBE_STEPS,
            **TRAINING,
        )
    )  # fmt: skip
    report = score_model(
        probe["model_dir"], root / "report", validation_file=corpus["validation_file"], block_size=BLOCK_SIZE,
        max_blocks=SCORED_BLOCKS, batch_size=4, mask_passes=MASK_PASSES, min_count=2, cpu=True, disable_tqdm=True,
    )  # fmt: skip
    return dict(variant=variant, config=config, pretrain=pretrain, probe=probe, report=report,
                report_dir=root / "report", corpus=corpus)  # fmt: skip


def scored_blocks(model_dir: str, validation_file: str) -> torch.Tensor:
    """The blocks the scoring command scores, built independently here: [SCORED_BLOCKS, BLOCK_SIZE]."""
    raw = load_raw_datasets("unused", None, train_file=validation_file)
    blocks = tokenize_and_group(raw, load_tokenizer(model_dir), BLOCK_SIZE)["train"]
    return torch.tensor(blocks["input_ids"][:SCORED_BLOCKS])


def test_every_family_trains_probes_and_scores(pipeline_run):
    variant, report = pipeline_run["variant"], pipeline_run["report"]
    pretrain_dir, probe_dir = Path(pipeline_run["pretrain"]["model_dir"]), Path(pipeline_run["probe"]["model_dir"])
    losses = pipeline_run["pretrain"]["train_losses"]
    assert len(losses) == PRETRAIN_STEPS and all(math.isfinite(loss) for loss in losses)
    auto_class = AutoModelForMaskedLM if MODEL_CLASSES[variant] is TwoTowerForMaskedLM else AutoModelForCausalLM
    model = auto_class.from_pretrained(probe_dir)
    assert type(model) is MODEL_CLASSES[variant]
    assert model.config.tower_type == VARIANTS[variant].get("tower_type", "transformer")
    assert model.config.cooperative == VARIANTS[variant].get("cooperative", True)

    # The probe phase trained only the probes, whatever the family.
    pretrained, probed = load_file(pretrain_dir / "model.safetensors"), load_file(probe_dir / "model.safetensors")
    for name, tensor in pretrained.items():
        assert torch.equal(tensor, probed[name]) != name.startswith("probes."), name
    probe_metrics = pipeline_run["probe"]["eval_metrics"]
    assert probe_metrics["perplexity"] == pytest.approx(pipeline_run["pretrain"]["eval_metrics"]["perplexity"])
    assert all(probe_metrics[f"probe_{tower}_loss"] < math.log(400) for tower in (0, 1))  # the probes learned

    # Every scored token is predicted exactly once: all of them (masked, ELMo), all but each block's first (causal).
    objective = "causal" if MODEL_CLASSES[variant] is TwoTowerForCausalLM else "masked"
    per_block = BLOCK_SIZE - 1 if objective == "causal" else BLOCK_SIZE
    assert report["data"]["num_blocks"] == SCORED_BLOCKS
    assert report["data"]["num_predictions"] == report["summary"]["num_predictions"] == SCORED_BLOCKS * per_block
    assert report["settings"]["objective"] == objective
    expected_masking = "7 deterministic passes, each token masked once" if variant == "masked" else "none"
    assert report["settings"]["masking"].startswith(expected_masking)
    assert report["model"]["architecture"] == MODEL_CLASSES[variant].__name__
    assert f"Objective: {objective} LM" in (pipeline_run["report_dir"] / "report.md").read_text()


@pytest.mark.parametrize("pipeline_run", ["masked", "elmo"], indirect=True)
def test_masked_scoring_masks_every_token_exactly_once(pipeline_run):
    model_dir = pipeline_run["probe"]["model_dir"]
    model = TwoTowerForMaskedLM.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    blocks = scored_blocks(model_dir, pipeline_run["corpus"]["validation_file"])
    # Recomputed position by position (the scoring goes pass by pass): the same masks, one labelled position each.
    gold = torch.zeros(2, *blocks.shape, dtype=torch.float64)
    with torch.no_grad():
        for position in range(BLOCK_SIZE):
            inputs, labels = blocks.clone(), torch.full_like(blocks, -100)
            labels[:, position] = blocks[:, position]
            if pipeline_run["variant"] == "masked":
                # the scoring passes mask 7 positions per pass at once; mask the same ones here
                same_pass = [p for p in range(BLOCK_SIZE) if p % MASK_PASSES == position % MASK_PASSES]
                inputs[:, same_pass] = tokenizer.mask_token_id
            gold[:, :, position] = model.probe_logprobs(inputs, labels=labels)[:, :, position].double()
    probe_perplexities = torch.exp(-gold.mean(dim=(1, 2))).tolist()
    assert pipeline_run["report"]["perplexity"]["probes"] == pytest.approx(probe_perplexities, rel=1e-5)

    table = pd.read_csv(pipeline_run["report_dir"] / "preference_per_token.csv", keep_default_na=False)
    counts = np.bincount(blocks.flatten().numpy())
    assert dict(zip(table["token_id"], table["count"])) == {i: c for i, c in enumerate(counts) if c}
    for tower in (0, 1):
        token_means = {
            token: gold[tower][blocks == token].mean().item() for token in table["token_id"]
        }
        np.testing.assert_allclose(table[f"mean_logprob_tower{tower}"], list(token_means.values()), rtol=1e-5)


def test_masking_depends_only_on_seed_epoch_and_block(corpus):
    tokenizer = load_tokenizer(corpus["tokenizer"])
    blocks = torch.randint(0, 256, (64, BLOCK_SIZE), generator=torch.Generator().manual_seed(0))
    collator = SeededMaskingCollator(tokenizer, mlm_probability=0.15, seed=7)
    batch = collator([{"input_ids": block} for block in blocks])
    alone = collator([{"input_ids": blocks[5]}])  # another batch, another process: the same masks
    assert torch.equal(alone["input_ids"][0], batch["input_ids"][5])
    assert torch.equal(alone["labels"][0], batch["labels"][5])
    labelled = batch["labels"] != -100
    assert torch.equal(batch["labels"][labelled], blocks[labelled])  # labels: the original ids, where selected
    assert 0.10 < labelled.float().mean() < 0.20  # 15% selected
    replaced_by_mask = batch["input_ids"][labelled] == tokenizer.mask_token_id
    assert 0.65 < replaced_by_mask.float().mean() < 0.95  # 80% of them [MASK] (the rest random or unchanged)
    assert torch.equal(batch["input_ids"][~labelled], blocks[~labelled])  # unselected tokens untouched
    collator.set_epoch(1)
    assert not torch.equal(collator([{"input_ids": block} for block in blocks])["labels"], batch["labels"])
    other_seed = SeededMaskingCollator(tokenizer, mlm_probability=0.15, seed=8)([{"input_ids": b} for b in blocks])
    assert not torch.equal(other_seed["labels"], batch["labels"])


@pytest.mark.parametrize("pipeline_run", ["masked"], indirect=True)
def test_masked_run_resumed_mid_epoch_ends_bitwise_equal(pipeline_run, tmp_path):
    # the masks must not depend on where the run restarted
    checkpoint = Path(pipeline_run["config"].output_dir) / "checkpoints" / "step_10"
    assert json.loads((checkpoint / "progress.json").read_text())["epoch"] == 1  # mid-epoch, past the first
    resumed = training_function(
        dataclasses.replace(pipeline_run["config"], output_dir=str(tmp_path), resume_from_checkpoint=str(checkpoint))
    )
    assert resumed["train_losses"] == pipeline_run["pretrain"]["train_losses"][10:]
    uninterrupted = load_file(Path(pipeline_run["pretrain"]["model_dir"]) / "model.safetensors")
    after_resume = load_file(Path(resumed["model_dir"]) / "model.safetensors")
    assert all(torch.equal(tensor, after_resume[name]) for name, tensor in uninterrupted.items())


CARD_EXPECTATIONS = {  # pipeline tag, tags that must be present, tags that must not
    "masked": ("fill-mask", {"masked-lm"}, {"causal-lm", "lstm", "independent-towers-control"}),
    "elmo": ("fill-mask", {"masked-lm", "lstm"}, {"causal-lm", "independent-towers-control"}),
    "lstm_causal": ("text-generation", {"causal-lm", "lstm"}, {"masked-lm", "independent-towers-control"}),
    "control": ("text-generation", {"causal-lm", "independent-towers-control"}, {"masked-lm", "lstm"}),
}


def test_model_card_names_the_family(pipeline_run):
    variant = pipeline_run["variant"]
    card = render_model_card(pipeline_run["probe"]["model_dir"], "lab/tiny", pipeline_run["report_dir"])
    metadata = card.data.to_dict()
    pipeline_tag, present, absent = CARD_EXPECTATIONS[variant]
    assert metadata["pipeline_tag"] == pipeline_tag
    assert present <= set(metadata["tags"]) and not absent & set(metadata["tags"])
    text = card.text
    auto_class = "AutoModelForMaskedLM" if pipeline_tag == "fill-mask" else "AutoModelForCausalLM"
    assert text.count(f"{auto_class}.from_pretrained(") == 2 and "{{" not in text
    assert ("model.generate(" in text) == (pipeline_tag == "text-generation")
    # the causal-LM caveat only for causal models; the control says what it is
    assert ("The objective is next-token prediction" in text) == (pipeline_tag == "text-generation")
    assert ("independent-towers control" in text) == (variant == "control")
    embedding_size = TwoTowerConfig.from_pretrained(pipeline_run["probe"]["model_dir"]).embedding_size
    assert f"A shared token embedding of width {embedding_size} plus" in text
    assert f"| Shared embedding and tied decoder width (`embedding_size`) | {embedding_size} |" in text


@pytest.mark.parametrize("pipeline_run", ["masked"], indirect=True)  # tests/modeling/test_model_families.py covers every family
def test_staged_masked_model_loads_as_remote_code_in_a_clean_process(pipeline_run, tmp_path):
    staged = stage_model_repo(pipeline_run["probe"]["model_dir"], tmp_path / "repo", "lab/tiny-masked")
    assert ModelCard.load(staged / "README.md").data.pipeline_tag == "fill-mask"
    model = TwoTowerForMaskedLM.from_pretrained(staged).eval()
    input_ids = scored_blocks(str(staged), pipeline_run["corpus"]["validation_file"])[:2]
    labels = input_ids.clone()
    expected = {"input_ids": input_ids, "logits": model(input_ids).logits,
                "probe_logprobs": model.probe_logprobs(input_ids, labels=labels)}  # fmt: skip
    torch.save(expected, tmp_path / "expected.pt")
    script = textwrap.dedent(
        """
        import sys
        sys.modules["modeling_twotower"] = None  # the package must not be importable here
        sys.modules["twotower"] = None
        import torch
        from transformers import AutoModelForMaskedLM
        expected = torch.load("expected.pt")
        model = AutoModelForMaskedLM.from_pretrained(sys.argv[1], trust_remote_code=True)
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        input_ids = expected["input_ids"]
        assert torch.equal(model(input_ids).logits, expected["logits"])
        assert torch.equal(model.probe_logprobs(input_ids, labels=input_ids.clone()), expected["probe_logprobs"])
        print("remote code OK")
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", script, str(staged)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=HANG_LIMIT_S)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "remote code OK" in result.stdout


@pytest.mark.parametrize("pipeline_run", ["masked"], indirect=True)
def test_options_that_do_not_fit_a_family_fail_clearly(pipeline_run, corpus, shared_data, tmp_path):
    gpt2 = str(shared_data / "tokenizers" / "gpt2")
    with pytest.raises(ValueError, match="needs a tokenizer with a mask token"):
        training_function(pretrain_config("masked", corpus, tmp_path / "a", tokenizer_name_or_path=gpt2))
    with pytest.raises(ValueError, match="--objective causal does not fit --pretrained_model"):
        training_function(TwoTowerTrainingConfig(
            phase="probe", objective="causal", pretrained_model=pipeline_run["pretrain"]["model_dir"],
            output_dir=str(tmp_path / "b"), train_file=corpus["train_file"], **TRAINING,
        ))  # fmt: skip
    with pytest.raises(ValueError, match="`objective` is 'mlm'; choose one of"):
        TwoTowerTrainingConfig(objective="mlm")
    with pytest.raises(ValueError, match="`tower_type` is 'gru'; choose one of"):
        TwoTowerTrainingConfig(tower_type="gru")
    with pytest.raises(ValueError, match="`mask_passes` must be >= 1"):
        score_model(pipeline_run["probe"]["model_dir"], tmp_path / "c", validation_file=corpus["validation_file"],
                    mask_passes=0)  # fmt: skip


def test_flops_per_token_counts_both_lstm_stacks_of_the_elmo_towers():
    # bidirectional as the training command saves it: the config alone does not name the model class
    config = TwoTowerConfig.from_preset("tiny", vocab_size=320, tower_type="lstm", lstm_hidden_size=96, bidirectional=True)
    model = TwoTowerForMaskedLM(config)
    # Independently: every matmul weight a token goes through (forward and backward stacks, context projections,
    # fusion head, tied decoder once as lm_head); embedding lookups are free.
    trained = sum(
        param.numel() for name, param in model.named_parameters()
        if name.startswith(("model.", "lm_head.")) and "weight" in name and "embed_" not in name and "norm" not in name
    ) + model.lm_head.decoder.weight.numel()  # fmt: skip
    assert flops_per_token(model, 128, "pretrain") == 6 * trained
