"""The base model's parts, each chosen once for the config's layout: the embedding, the towers' stack and their fusion
(checkpoints saved before they were modules: tests/modeling/test_convert_checkpoint.py)."""

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
from modeling_twotower.towers_elmo import TwoTowerELMoTowers
from modeling_twotower.towers_lstm import TwoTowerLSTMTowers
from modeling_twotower.towers_transformer import TwoTowerTransformerTowers

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
