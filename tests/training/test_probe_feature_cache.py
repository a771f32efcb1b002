"""Where the probe phase's features come from: a cache in memory or on disk, or the frozen towers recomputed (none).

Every mode reads the same block-based data order, so memory, disk and none train the same probes; `auto` chooses by
the cache's size. The frozen model is a tiny untrained two-tower model with a BPE of 320 tokens trained on a slice
of WikiText-2; every run takes about a second.
"""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from safetensors.torch import load_file

from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.training.arguments import TwoTowerTrainingConfig, load_config
from twotower.training.data.blocks import load_raw_datasets, tokenize_and_group
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.data.objectives import make_collators
from twotower.training.feature_cache.probe_cache import cache_both_splits, plan_feature_cache
from twotower.training.data.tokenizer import load_tokenizer
from twotower.training.train import training_function
from conftest import HANG_LIMIT_S
from test_probe_training import saved_model, sliced_corpus_with_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
BLOCK_SIZE = 32
TRAIN_BLOCKS, EVAL_BLOCKS = 24, 8  # 3 steps of 8 blocks an epoch
# test_probe_training's tiny model (its vocabulary of 320 and block size), narrower and without dropout
NARROWER_MODEL = dict(hidden_size=24, intermediate_size=40, hidden_dropout=0.0, attention_dropout=0.0)
MODES = ("memory", "disk", "none")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, shared_data) -> dict:
    """40 kB of WikiText-2 train and 10 kB of validation, and a BPE (with <mask>) trained on the slice."""
    folder = tmp_path_factory.mktemp("wikitext-2-feature-cache")
    return sliced_corpus_with_tokenizer(folder, shared_data, 40_000, 10_000)


@pytest.fixture(scope="module")
def models(corpus, tmp_path_factory) -> dict:
    """{"causal", "masked"}: new tiny models saved with the corpus' tokenizer, as a pretrain run would leave them."""
    return {
        objective: saved_model(corpus, tmp_path_factory.mktemp(objective), model_class, **NARROWER_MODEL)
        for objective, model_class in (("causal", TwoTowerForCausalLM), ("masked", TwoTowerForMaskedLM))
    }


def probe_config(model_dir: str, corpus: dict, output_dir: Path, **overrides) -> TwoTowerTrainingConfig:
    options = dict(
        phase="probe", pretrained_model=model_dir, output_dir=str(output_dir), train_file=corpus["train_file"],
        validation_file=corpus["validation_file"], block_size=BLOCK_SIZE, max_train_blocks=TRAIN_BLOCKS,
        max_eval_blocks=EVAL_BLOCKS, per_device_train_batch_size=8, per_device_eval_batch_size=5, num_train_epochs=2,
        eval_steps=3, learning_rate=1e-2, num_warmup_steps=1, probe_replicas=2, cpu=True, report_to="none",
        disable_tqdm=True, peak_tflops=1.0, logging_steps=100, checkpointing_steps=100,
    )  # fmt: skip
    return TwoTowerTrainingConfig(**{**options, **overrides})


def run(models, corpus, output_dir: Path, objective: str, **overrides) -> dict:
    result = training_function(probe_config(models[objective], corpus, output_dir, **overrides))
    return {**result, "probes": load_file(Path(result["model_dir"]) / "model.safetensors")}


def assert_same_probes(result: dict, expected: dict) -> None:
    assert result["completed_steps"] == expected["completed_steps"] == 6
    assert result["train_losses"] == pytest.approx(expected["train_losses"], rel=1e-5)
    assert result["eval_metrics"] == pytest.approx(expected["eval_metrics"], rel=1e-5)
    for name, weight in expected["probes"].items():
        torch.testing.assert_close(result["probes"][name], weight, rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def runs_by_mode(models, corpus, tmp_path_factory):
    """runs_by_mode(objective): {mode: the run's result} for every mode, each run once per module."""
    done = {}

    def runs(objective: str) -> dict:
        if objective not in done:
            done[objective] = {mode: run(models, corpus, tmp_path_factory.mktemp(f"{objective}-{mode}"), objective,
                                         probe_feature_cache=mode) for mode in MODES}  # fmt: skip
        return done[objective]

    return runs


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_memory_disk_and_none_train_the_same_probes(runs_by_mode, objective):
    runs = runs_by_mode(objective)
    assert runs["memory"]["train_losses"][-1] < runs["memory"]["train_losses"][0]  # they learn
    for mode in ("disk", "none"):
        assert_same_probes(runs[mode], runs["memory"])


def test_auto_recomputes_when_the_cache_exceeds_its_budgets(runs_by_mode, models, corpus, tmp_path, monkeypatch,
                                                             capsys):  # fmt: skip
    expected_run = runs_by_mode("causal")["none"]
    capsys.readouterr()
    monkeypatch.setattr("twotower.training.feature_cache.probe_cache.free_memory_bytes", lambda accelerator: 0)
    result = run(models, corpus, tmp_path, "causal", probe_feature_cache="auto", probe_cache_max_gb=1e-6)
    out = capsys.readouterr().out
    # 2 towers x 24 float32 = 192 bytes per position; 24 x 31 training + 8 x 31 validation next-token positions
    expected = ("Probe features: 2 x 24 float32 per position, 744 training + 248 validation positions = 190.5 kB > "
                "--probe_cache_max_gb 1e-06 and > 0 B, half the free memory: recomputing the frozen towers every step "
                "(probe_feature_cache none)")  # fmt: skip
    assert expected in out and "Cached the frozen towers' features" not in out
    assert_same_probes(result, expected_run)
    assert not (tmp_path / "probe_feature_cache").exists()


def test_auto_caches_in_memory_when_it_fits(models, corpus, tmp_path, capsys):
    config = probe_config(models["causal"], corpus, tmp_path, probe_feature_cache="auto", probe_cache_max_gb=1e-6)
    caches = cached_splits(config, Accelerator(cpu=True))
    out = capsys.readouterr().out
    assert "190.5 kB <= " in out and "half the free memory: caching them in memory (probe_feature_cache memory)" in out
    assert caches["train"].features.device.type == "cpu" and len(caches["train"]) == TRAIN_BLOCKS * (BLOCK_SIZE - 1)


def cached_splits(config: TwoTowerTrainingConfig, accelerator) -> dict:
    """cache_both_splits over the config's blocks, with the config's pretrained causal model."""
    tokenizer = load_tokenizer(config.pretrained_model)
    raw = load_raw_datasets("unused", None, config.train_file, config.validation_file)
    lm_datasets = tokenize_and_group(raw, tokenizer, BLOCK_SIZE)
    lm_datasets = {"train": lm_datasets["train"].select(range(TRAIN_BLOCKS)),
                   "validation": lm_datasets["validation"].select(range(EVAL_BLOCKS))}  # fmt: skip
    model = TwoTowerForCausalLM.from_pretrained(config.pretrained_model).eval()
    collators = make_collators("causal", model.model.towers, tokenizer, 0.15, config.seed)
    return cache_both_splits(accelerator, model, lm_datasets, collators, "causal", config)


@pytest.fixture()
def fresh_accelerator_state():
    # Accelerate keeps one process-wide state, fixed by the first Accelerator: another precision needs it reset.
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def test_a_bf16_cache_keeps_bf16_features_in_half_the_bytes_and_trains(models, corpus, tmp_path,
                                                                        fresh_accelerator_state):  # fmt: skip
    float32 = cached_splits(probe_config(models["causal"], corpus, tmp_path / "fp32", probe_feature_cache="disk"),
                            Accelerator(cpu=True))  # fmt: skip
    AcceleratorState._reset_state(reset_partial_state=True)
    config = probe_config(models["causal"], corpus, tmp_path / "bf16", probe_feature_cache="disk",
                          mixed_precision="bf16")  # fmt: skip
    bf16 = cached_splits(config, Accelerator(cpu=True, mixed_precision="bf16"))
    features = bf16["train"].features
    assert features.dtype == torch.bfloat16 and features.shape == float32["train"].features.shape
    disk_file = tmp_path / "bf16" / "probe_feature_cache" / "train_process0.bin"
    assert disk_file.stat().st_size == features.numel() * 2 == (tmp_path / "fp32" / disk_file.relative_to(
        tmp_path / "bf16")).stat().st_size // 2  # fmt: skip
    # the same features, rounded to bf16 (8 bits of mantissa; autocast computes them in bf16 too), read as float32
    chunk, _ = bf16["train"].chunk(0, 100)
    assert chunk.dtype == torch.float32
    torch.testing.assert_close(chunk, float32["train"].chunk(0, 100)[0], rtol=0.1, atol=0.1)

    AcceleratorState._reset_state(reset_partial_state=True)
    result = training_function(dataclasses.replace(config, output_dir=str(tmp_path / "bf16-run")))
    assert result["train_losses"][-1] < result["train_losses"][0]


def test_linear_probes_refuse_recomputed_features(models, corpus, tmp_path):
    with pytest.raises(TwoTowerUserError, match=r"--probe_type linear runs full-batch L-BFGS over cached features, "
                                                r"and --probe_feature_cache none caches none: pass "
                                                r"--probe_feature_cache memory, disk or auto"):  # fmt: skip
        probe_config(models["causal"], corpus, tmp_path, probe_type="linear", probe_feature_cache="none",
                     max_train_steps=10)  # fmt: skip


BASE_PROBE_ON_WIKITEXT_103 = dict(  # the dry run of docs/training.md: recipe base_probe, fp16, on one 80 GB GPU
    num_towers=2, hidden_size=384, dtype=torch.float16, train_positions=103_227_021, validation_positions=217_646,
    free_memory_bytes=80 * 10**9, free_disk_bytes=2 * 10**12,
)  # fmt: skip


def test_plan_chooses_by_size_and_says_why():
    plan = plan_feature_cache("auto", "mlp", probe_cache_max_gb=50.0, **BASE_PROBE_ON_WIKITEXT_103)
    assert plan.choice == "none" and plan.cache_bytes == (103_227_021 + 217_646) * 2 * 384 * 2
    assert plan.message == (
        "Probe features: 2 x 384 fp16 per position, 103,227,021 training + 217,646 validation positions = 158.9 GB > "
        "--probe_cache_max_gb 50.0 and > 40.0 GB, half the free memory: recomputing the frozen towers every step "
        "(probe_feature_cache none)"
    )
    assert load_config("base_probe").probe_feature_cache == "auto"
    assert load_config("base_probe").probe_cache_max_gb == 50.0
    # the default disk budget: half the output folder's free disk (here 1 TB of 2)
    plan = plan_feature_cache("auto", "mlp", **BASE_PROBE_ON_WIKITEXT_103)
    assert plan.choice == "disk"
    assert "<= 1.0 TB, half the output folder's free disk: caching them on disk" in plan.message
    plan = plan_feature_cache("auto", "mlp", **{**BASE_PROBE_ON_WIKITEXT_103, "free_memory_bytes": 400 * 10**9})
    assert plan.choice == "memory"
    asked = plan_feature_cache("disk", "mlp", probe_cache_max_gb=200.0, **BASE_PROBE_ON_WIKITEXT_103)
    assert asked.choice == "disk"
    assert asked.message.endswith(": caching them on disk under OUTPUT_DIR/probe_feature_cache "
                                  "(--probe_feature_cache disk) (<= --probe_cache_max_gb 200.0)")
    with pytest.raises(TwoTowerUserError, match=r"158.9 GB > --probe_cache_max_gb 50.0: --probe_feature_cache disk "
                                                r"does not fit its budget"):  # fmt: skip
        plan_feature_cache("disk", "mlp", probe_cache_max_gb=50.0, **BASE_PROBE_ON_WIKITEXT_103)
    with pytest.raises(TwoTowerUserError, match=r"158.9 GB > --probe_cache_max_gb 50.0 .*--probe_type linear needs a "
                                                r"cache"):  # fmt: skip
        plan_feature_cache("auto", "linear", probe_cache_max_gb=50.0, **BASE_PROBE_ON_WIKITEXT_103)


@pytest.mark.slow
def test_two_processes_recompute_their_own_share_as_they_would_cache_it(models, corpus, tmp_path):
    # Each process orders and reads only its own blocks: recomputed, they train the probes their caches would.
    results = {}
    for mode in ("memory", "none"):
        config = probe_config(models["masked"], corpus, tmp_path / mode, probe_feature_cache=mode,
                              per_device_train_batch_size=4)  # fmt: skip
        cli_args = [f"--{name}={value}" for name, value in dataclasses.asdict(config).items() if value is not None]
        launched = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "twotower.training.train",
             *cli_args],
            cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_LIMIT_S,
        )  # fmt: skip
        assert launched.returncode == 0, launched.stderr[-4000:]
        results[mode] = load_file(tmp_path / mode / "model" / "model.safetensors")
    for name, weight in results["memory"].items():
        torch.testing.assert_close(results["none"][name], weight, rtol=1e-4, atol=1e-5, msg=name)
