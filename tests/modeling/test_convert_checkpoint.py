"""
scripts/convert_checkpoint.py on the checkpoints saved by earlier code with earlier parameter names: the LM heads
before they were modules (tests/fixtures/causal, control, masked) and the base model's parts before they were modules
(tests/fixtures/layouts/*). Each fixture was saved after `torch.manual_seed(0)` with a TwoTowerConfig of hidden size
12, 2 layers and vocabulary 64, with its logits and probe log-probabilities on a fixed input (expected.safetensors).
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM, TwoTowerModel
from conftest import HANG_LIMIT_S

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
SCRIPT = ROOT / "scripts" / "convert_checkpoint.py"
OLD_CHECKPOINTS = {
    "causal": TwoTowerForCausalLM, "control": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM,
    "layouts/gpt": TwoTowerForCausalLM, "layouts/elmo": TwoTowerForMaskedLM, "layouts/lstm": TwoTowerForCausalLM,
    "layouts/separate": TwoTowerForCausalLM,
}  # fmt: skip
OLD_NAMES = ("fusion_", "tower_lm_heads.", "lm_head.weight", "model.embed_positions", "model.elmo_towers.", "model.layers.")


def load_script():
    spec = importlib.util.spec_from_file_location("convert_checkpoint", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_expected_outputs(model, expected):
    with torch.no_grad():
        logits = model.eval()(expected["input_ids"]).logits
        labels = expected["labels"] if isinstance(model, TwoTowerForMaskedLM) else None
        probe_logprobs = model.probe_logprobs(expected["input_ids"], labels=labels, all_replicas=True)
    # saved on another CPU, whose float kernels may round differently in the last bits; a weight loaded under a
    # wrong name (or left at its initialisation) would be off by whole units
    torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-6)
    # [towers, replicas, batch, seq]; fixtures saved with one replica per tower dropped that dimension
    probe_logprobs = probe_logprobs.reshape(expected["probe_logprobs"].shape)
    torch.testing.assert_close(probe_logprobs, expected["probe_logprobs"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", OLD_CHECKPOINTS)
def test_a_converted_checkpoint_loads_to_the_saved_numbers(name, tmp_path):
    old_dir, model_class = FIXTURES / name, OLD_CHECKPOINTS[name]
    old_keys = load_file(old_dir / "model.safetensors").keys()
    assert any(key.startswith(OLD_NAMES) for key in old_keys)
    before = {path.name: path.read_bytes() for path in old_dir.iterdir()}

    load_script().convert_folder(old_dir, tmp_path / "new")

    assert {path.name: path.read_bytes() for path in old_dir.iterdir()} == before  # the input is never written
    new_weights = load_file(tmp_path / "new" / "model.safetensors")
    assert len(new_weights) == len(old_keys) and not any(key.startswith(OLD_NAMES) for key in new_weights)
    model, info = model_class.from_pretrained(tmp_path / "new", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    expected = load_file(old_dir / "expected.safetensors")
    assert_expected_outputs(model, expected)
    # the base model alone reads the LM's converted checkpoint too
    base = TwoTowerModel.from_pretrained(tmp_path / "new").eval()
    with torch.no_grad():
        features = base(expected["input_ids"], use_cache=False).last_hidden_state
        torch.testing.assert_close(features, model.model(expected["input_ids"], use_cache=False).last_hidden_state, rtol=0, atol=0)


def test_the_command_never_replaces_a_folder(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "kept.txt").write_text("mine")
    command = [sys.executable, str(SCRIPT), str(FIXTURES / "causal")]
    refused = subprocess.run([*command, str(tmp_path / "taken")], capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert refused.returncode != 0 and "exists" in refused.stderr
    assert [path.name for path in (tmp_path / "taken").iterdir()] == ["kept.txt"]
    done = subprocess.run([*command, str(tmp_path / "new")], capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert done.returncode == 0 and "tensors renamed" in done.stdout
    assert not list(tmp_path.glob(".new.*"))  # no staging folder left behind
