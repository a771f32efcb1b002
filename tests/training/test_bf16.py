"""bf16 mixed precision end to end on the CPU: pretrain and probe phases, 1 and 2 processes, against fp32 runs."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hub

import dataclasses
import glob
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from accelerate.state import AcceleratorState
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from twotower.training.arguments import RESOLVED_CONFIG_NAME, load_config
from twotower.training.launch.launch_checks import LAUNCH_PRECISION_VARIABLE
from twotower.training.train import training_function
from conftest import HANG_LIMIT_S
from test_training import corpus  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # launches processes or trains several models: `-m "not slow"` skips it

REPO_ROOT = Path(__file__).resolve().parents[2]
# Per-step training losses of bf16 autocast against fp32, 10 steps of the tiny models below on a 2-core CPU: at most
# 6.9e-5 relative (pretrain, 1 process), 5.5e-5 (pretrain, 2 processes against 1), 1.3e-5 and 1.5e-5 (probes, 1 and 2
# processes). The tolerance leaves ~15x that.
BF16_RTOL = 1e-3
STEPS = 10


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    # Accelerate keeps one process-wide state, fixed by the first Accelerator: another precision needs it reset.
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def tiny_options(recipe: str, corpus: dict, output_dir: Path, **overrides) -> list[str]:
    """Command-line options of the shipped recipe shrunk to seconds: 64 blocks of 32 tokens, batches of 8, 10 steps,
    no dropout (so the two precisions draw nothing differently)."""
    options = dict(
        **corpus, output_dir=output_dir, tokenizer_vocab_size=512, block_size=32, max_train_blocks=64,
        max_eval_blocks=32, per_device_train_batch_size=8, max_train_steps=STEPS, num_warmup_steps=2,
        learning_rate=3e-3, checkpointing_steps=100, logging_steps=1, peak_tflops=1.0, disable_tqdm=True, cpu=True,
    )
    if recipe == "tiny":
        options.update(hidden_dropout=0.0, attention_dropout=0.0)
    else:
        options.update(eval_steps=STEPS)
    options.update(overrides)
    return [f"--{name}={value}" for name, value in options.items()]


def run_in_process(recipe: str, corpus: dict, output_dir: Path, **overrides) -> dict:
    AcceleratorState._reset_state(reset_partial_state=True)
    return training_function(load_config(recipe, tiny_options(recipe, corpus, output_dir, **overrides)))


def run_two_processes(recipe: str, corpus: dict, output_dir: Path, **overrides) -> dict:
    """torchrun with 2 CPU processes (gloo), 4 blocks each a micro-batch: the same global batch as 1 process of 8."""
    config = load_config(recipe, tiny_options(recipe, corpus, output_dir, per_device_train_batch_size=4, **overrides))
    cli_args = [f"--{name}={value}" for name, value in dataclasses.asdict(config).items() if value is not None]
    launched = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "twotower.training.train",
         *cli_args],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=HANG_LIMIT_S,
    )
    assert launched.returncode == 0, launched.stderr[-4000:]
    return {name: tensorboard_scalars(output_dir, config.phase, f"{kind}/loss") for name, kind in
            (("train_losses", "train"), ("eval_losses", "eval"))}


def tensorboard_scalars(output_dir: Path, phase: str, tag: str) -> list[float]:
    (events_file,) = glob.glob(str(output_dir / "runs" / phase / "events.out.tfevents.*"))
    events = EventAccumulator(events_file)
    events.Reload()
    return [event.value for event in events.Scalars(tag)]


def assert_bf16_close(bf16_losses: list[float], fp32_losses: list[float]) -> None:
    assert len(bf16_losses) == len(fp32_losses) == STEPS
    assert bf16_losses != fp32_losses  # autocast ran: bf16 matmuls round differently
    assert bf16_losses == pytest.approx(fp32_losses, rel=BF16_RTOL)


@pytest.fixture(scope="module")
def fp32_pretrain(corpus, tmp_path_factory) -> dict:
    return run_in_process("tiny", corpus, tmp_path_factory.mktemp("fp32-pretrain"), mixed_precision="no")


def test_bf16_pretraining_matches_fp32(corpus, fp32_pretrain, tmp_path):
    bf16 = run_in_process("tiny", corpus, tmp_path, mixed_precision="bf16")
    assert_bf16_close(bf16["train_losses"], fp32_pretrain["train_losses"])
    assert bf16["train_losses"][-1] < bf16["train_losses"][0]  # and it learns
    assert bf16["eval_metrics"]["loss"] == pytest.approx(fp32_pretrain["eval_metrics"]["loss"], rel=BF16_RTOL)


def test_the_saved_config_records_the_precision_the_launch_chose(corpus, tmp_path, monkeypatch):
    # `accelerate launch --mixed_precision bf16` (or its config file) with the option unset: the model card reads this
    monkeypatch.setenv(LAUNCH_PRECISION_VARIABLE, "bf16")
    run = run_in_process("tiny", corpus, tmp_path, max_train_steps=1)
    saved = yaml.safe_load((Path(run["model_dir"]) / RESOLVED_CONFIG_NAME).read_text())
    assert saved["mixed_precision"] is None and saved["precision"] == "bf16"


def test_bf16_probe_phase_matches_fp32(corpus, fp32_pretrain, tmp_path):
    model = fp32_pretrain["model_dir"]
    fp32 = run_in_process("tiny_probe", corpus, tmp_path / "fp32", pretrained_model=model, mixed_precision="no")
    bf16 = run_in_process("tiny_probe", corpus, tmp_path / "bf16", pretrained_model=model, mixed_precision="bf16")
    assert_bf16_close(bf16["train_losses"], fp32["train_losses"])
    for name, value in fp32["eval_metrics"].items():
        if name.endswith("_loss") or name == "loss":
            assert bf16["eval_metrics"][name] == pytest.approx(value, rel=BF16_RTOL), name


def test_bf16_on_two_processes_matches_fp32_on_one(corpus, fp32_pretrain, tmp_path):
    # 2 x 4 blocks = 1 x 8: in fp32 the two give the same losses to 1e-5 (tests/training/test_training.py)
    two = run_two_processes("tiny", corpus, tmp_path, mixed_precision="bf16")
    assert_bf16_close(two["train_losses"], fp32_pretrain["train_losses"])
    assert two["eval_losses"] == pytest.approx([fp32_pretrain["eval_metrics"]["loss"]], rel=BF16_RTOL)


def test_bf16_probe_phase_on_two_processes_matches_fp32(corpus, fp32_pretrain, tmp_path):
    # Each process caches its own share of the blocks and draws its own positions, so the fp32 reference is 2 processes.
    model = fp32_pretrain["model_dir"]
    fp32 = run_two_processes("tiny_probe", corpus, tmp_path / "fp32", pretrained_model=model, mixed_precision="no")
    bf16 = run_two_processes("tiny_probe", corpus, tmp_path / "bf16", pretrained_model=model, mixed_precision="bf16")
    assert_bf16_close(bf16["train_losses"], fp32["train_losses"])
    assert bf16["eval_losses"] == pytest.approx(fp32["eval_losses"], rel=BF16_RTOL)
