"""The base model's parts, each chosen once for the config's layout: the embedding, the towers' stack and their fusion
(checkpoints saved before they were modules: tests/modeling/test_convert_checkpoint.py; every tower kind's stack:
tests/modeling/test_kind_conformance.py)."""

import inspect
import re

import pytest

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM, TwoTowerModel
from modeling_twotower.embeddings import (
    TwoTowerELMoEmbeddings,
    TwoTowerEmbeddings,
    TwoTowerGPTEmbeddings,
    TwoTowerSeparateEmbeddings,
)
from modeling_twotower.fusion import TwoTowerFusion, TwoTowerIndependentFusion
from modeling_twotower.towers import tower_stack_class

SIZES = dict(vocab_size=64, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=20)
# config overrides -> the embedding and fusion classes the base model holds (its stack: the config's kind's)
PARTS = {
    "bert": ({}, TwoTowerEmbeddings, TwoTowerFusion),
    "bert-control": ({"cooperative": False}, TwoTowerEmbeddings, TwoTowerIndependentFusion),
    "separate": ({"separate_embeddings": True, "cooperative": False}, TwoTowerSeparateEmbeddings,
                 TwoTowerIndependentFusion),
    "gpt": ({"layout": "gpt"}, TwoTowerGPTEmbeddings, TwoTowerFusion),
    "elmo": ({"layout": "elmo", "lstm_hidden_size": 16}, TwoTowerELMoEmbeddings, TwoTowerFusion),
}  # fmt: skip


@pytest.mark.parametrize("name", PARTS)
def test_the_config_chooses_each_part_once(name):
    overrides, embeddings, fusion = PARTS[name]
    config = TwoTowerConfig(**SIZES, **overrides)
    model_class = TwoTowerForMaskedLM if overrides.get("layout") == "elmo" else TwoTowerForCausalLM
    model = model_class(config).model
    assert (type(model.embeddings), type(model.towers), type(model.fusion)) == (
        embeddings, tower_stack_class(config), fusion
    )
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
