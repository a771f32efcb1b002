"""The base model's parts, each chosen once for the config's layout: the embedding, the towers' stack and their fusion;
and checkpoints saved before they were modules (tests/fixtures/layouts, by that code: each `torch.manual_seed(0)`
then a TwoTowerConfig of hidden size 12, 2 layers, 2 probes per tower, vocabulary 64, with its outputs on a fixed
input in expected.safetensors) loading to the same numbers, by from_pretrained and by load_state_dict (the way
accelerate restores a training checkpoint).
"""

import inspect
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM, TwoTowerModel
from modeling_twotower.embeddings import (
    TwoTowerELMoEmbeddings,
    TwoTowerEmbeddings,
    TwoTowerGPTEmbeddings,
    TwoTowerSeparateEmbeddings,
)
from modeling_twotower.fusion import TwoTowerFusion, TwoTowerIndependentFusion
from modeling_twotower.lstm_towers import TwoTowerELMoTowers, TwoTowerLSTMTowers
from modeling_twotower.towers import TwoTowerTransformerTowers

LAYOUT_FIXTURES = Path(__file__).parent / "fixtures" / "layouts"
OLD_LAYOUTS = {"gpt": TwoTowerForCausalLM, "elmo": TwoTowerForMaskedLM, "lstm": TwoTowerForCausalLM,
               "separate": TwoTowerForCausalLM}  # fmt: skip
SIZES = dict(vocab_size=64, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=20)
# config overrides -> the embedding, stack and fusion classes the base model holds
PARTS = {
    "bert": ({}, TwoTowerEmbeddings, TwoTowerTransformerTowers, TwoTowerFusion),
    "bert-control": ({"cooperative": False}, TwoTowerEmbeddings, TwoTowerTransformerTowers, TwoTowerIndependentFusion),
    "separate": ({"separate_embeddings": True, "cooperative": False}, TwoTowerSeparateEmbeddings,
                 TwoTowerTransformerTowers, TwoTowerIndependentFusion),
    "gpt": ({"layout": "gpt"}, TwoTowerGPTEmbeddings, TwoTowerTransformerTowers, TwoTowerFusion),
    "lstm": ({"tower_type": "lstm"}, TwoTowerEmbeddings, TwoTowerLSTMTowers, TwoTowerFusion),
    "elmo": ({"layout": "elmo", "lstm_hidden_size": 16}, TwoTowerELMoEmbeddings, TwoTowerELMoTowers, TwoTowerFusion),
}  # fmt: skip


def outputs_on_the_fixed_input(model, expected):
    model.eval()
    with torch.no_grad():
        logits = model(expected["input_ids"]).logits
        labels = expected["labels"] if isinstance(model, TwoTowerForMaskedLM) else None
        return logits, model.probe_logprobs(expected["input_ids"], labels=labels, all_replicas=True)


def assert_expected_outputs(model, expected):
    logits, probe_logprobs = outputs_on_the_fixed_input(model, expected)
    # saved on another CPU, whose float kernels may round differently in the last bits; a weight loaded under a
    # wrong name (or left at its initialisation) would be off by whole units
    torch.testing.assert_close(logits, expected["logits"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(probe_logprobs, expected["probe_logprobs"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("layout", OLD_LAYOUTS)
def test_checkpoints_from_before_the_stack_modules_load_to_the_same_numbers(layout, tmp_path):
    folder, model_class = LAYOUT_FIXTURES / layout, OLD_LAYOUTS[layout]
    old_names = ("model.embed_positions", "model.elmo_towers.")
    assert any(key.startswith(old_names) for key in load_file(folder / "model.safetensors"))
    model, info = model_class.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    expected = load_file(folder / "expected.safetensors")
    assert_expected_outputs(model, expected)

    # saved again: today's names, the same numbers
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert saved.keys() == model.state_dict().keys() - model.all_tied_weights_keys.keys()
    assert_expected_outputs(model_class.from_pretrained(tmp_path), expected)


@pytest.mark.parametrize("layout", OLD_LAYOUTS)
def test_training_checkpoints_with_the_earlier_names_restore_through_load_state_dict(layout):
    folder, model_class = LAYOUT_FIXTURES / layout, OLD_LAYOUTS[layout]
    model = model_class(TwoTowerConfig.from_pretrained(folder))
    old_weights = load_file(folder / "model.safetensors")
    missing, unexpected = model.load_state_dict(old_weights, strict=False)
    assert not unexpected and set(missing) <= set(model.all_tied_weights_keys)  # only the tied decoder is not saved
    model.tie_weights()
    assert_expected_outputs(model, load_file(folder / "expected.safetensors"))


@pytest.mark.parametrize("layout", OLD_LAYOUTS)
def test_the_base_model_loads_an_old_lm_checkpoint(layout):
    folder = LAYOUT_FIXTURES / layout
    expected = load_file(folder / "expected.safetensors")
    lm = OLD_LAYOUTS[layout].from_pretrained(folder).eval()
    base, info = TwoTowerModel.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        features = base.eval()(expected["input_ids"]).last_hidden_state
        torch.testing.assert_close(features, lm.model(expected["input_ids"]).last_hidden_state, rtol=0, atol=0)


@pytest.mark.parametrize("name", PARTS)
def test_the_config_chooses_each_part_once(name):
    overrides, embeddings, towers, fusion = PARTS[name]
    model_class = TwoTowerForMaskedLM if overrides.get("layout") == "elmo" else TwoTowerForCausalLM
    model = model_class(TwoTowerConfig(**SIZES, **overrides)).model
    assert (type(model.embeddings), type(model.towers), type(model.fusion)) == (embeddings, towers, fusion)
    assert set(model._no_split_modules) == {towers.no_split_module}  # a class the model holds
    assert towers.no_split_module in {type(module).__name__ for module in model.modules()}
    # the parameters are the token embedding's and those of the three parts (the ELMo towers hold their own norms)
    parts = {name.split(".")[0] for name, _ in model.named_parameters()}
    assert parts == {"embed_tokens", "towers", "fusion"} | ({"embeddings"} if name != "elmo" else set())


CONSTRUCTED = [  # the ELMo layout is a masked LM only
    (name, model_class) for name in PARTS for model_class in (TwoTowerModel, TwoTowerForCausalLM, TwoTowerForMaskedLM)
    if not (name == "elmo" and model_class is TwoTowerForCausalLM)
]


@pytest.mark.parametrize("name, model_class", CONSTRUCTED)
def test_constructors_leave_the_config_as_it_was(name, model_class):
    overrides = PARTS[name][0]
    config = TwoTowerConfig(**SIZES, **overrides)
    before = config.to_dict()
    model = model_class(config)
    assert config.to_dict() == before and config.bidirectional is None
    wanted = model_class is TwoTowerForMaskedLM or (model_class is TwoTowerModel and name == "elmo")
    base = model if model_class is TwoTowerModel else model.model
    assert base.bidirectional is wanted


def test_the_forward_pass_reads_no_config_flag():
    source = inspect.getsource(TwoTowerModel.forward)
    flags = re.findall(r"config\.(layout|tower_type|cooperative|separate_embeddings|bidirectional)\b", source)
    assert flags == [] and len(source.splitlines()) < 60
