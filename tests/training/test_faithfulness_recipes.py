"""The paper recipes against the reference code (hezq06/twotower_lm): schedules in blocks read, hyper-parameters,
and the parameters weight decay spares. docs/FAITHFULNESS.md cites each number.
"""

import re

import pytest
import torch
from conftest import tiny_two_tower
from transformers import get_scheduler

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from twotower.training.arguments import read_recipe
from twotower.training.optim.optimization import weight_decay_groups
from twotower.training.phases import ProbesOnPositions

# workspace/ds_config/deepspeed_config_24hbert.json:2-4: 5120 blocks a step, 128 a micro-batch, 10 accumulated, so
# 4 processes; the schedule counts micro-batches of one process (ttlm/dslearn.py:264, 281).
REFERENCE_GLOBAL_BATCH, REFERENCE_MICRO_BATCH, REFERENCE_ACCUMULATION = 5120, 128, 10
REFERENCE_PROCESSES = REFERENCE_GLOBAL_BATCH // (REFERENCE_MICRO_BATCH * REFERENCE_ACCUMULATION)
# workspace/run_2towerlm.sh:7-8 and 15-19 (epochs, warm-up), workspace/TwoTowerLM.py:16 and 21 (micro-batches an epoch)
REFERENCE_PHASES = {
    "pretrain": dict(epochs=25, micro_batches_per_epoch=5000, warmup_micro_batches=10000),
    "probe": dict(epochs=30, micro_batches_per_epoch=1000, warmup_micro_batches=1000),
}
RECIPE_GPUS = 8  # the recipes reach their global batch on 8 GPUs (per device x accumulation x 8; see their headers)
FAMILIES = {  # recipe -> the reference model whose weight-decay groups it takes
    "base_masked": "bert", "large_masked": "bert", "gpt_base": "gpt", "gpt_large": "gpt", "base": "gpt",
    "large": "gpt", "elmo_base": "elmo", "elmo_large": "elmo",
}  # fmt: skip
PAPER_RECIPES = [name for pretrain in FAMILIES for name in (pretrain, f"{pretrain}_probe")]
# ttlm/model.py:429-431: TwoTowerDsBert spares the parameters whose names hold one of these; GPT and ELMo spare none
REFERENCE_NO_DECAY = ["bias", "LayerNorm.bias", "LayerNorm.weight", "attn_nw", "attn_nb", "norm_w", "norm_b",
                      "attn_qkvb", "attn_ob", "inter_b", "output_b"]  # fmt: skip
# our parameter names -> TwoTowerDsBert's (ttlm/model.py:38-86; DeepSpeedTransformerLayer's attn_*, inter_*, ...)
REFERENCE_NAMES = [
    (r"model\.embed_tokens\.weight", "pt_emb.weight"),
    (r"model\.embeddings\.embed_positions\.weight", "position_embeddings.weight"),
    (r"model\.embeddings\.embed_norm\.(weight|bias)", r"layer_norm_emb.\1"),
    (r"model\.embeddings\.tower_proj\.(weight|bias)", r"emb1.\1"),
    (r"model\.towers\.layers\.(\d+)\.input_layernorm\.weight", r"trf_layers1.\1.attn_nw"),
    (r"model\.towers\.layers\.(\d+)\.input_layernorm\.bias", r"trf_layers1.\1.attn_nb"),
    (r"model\.towers\.layers\.(\d+)\.self_attn\.[qkv]_proj\.weight", r"trf_layers1.\1.attn_qkvw"),
    (r"model\.towers\.layers\.(\d+)\.self_attn\.[qkv]_proj\.bias", r"trf_layers1.\1.attn_qkvb"),
    (r"model\.towers\.layers\.(\d+)\.self_attn\.o_proj\.weight", r"trf_layers1.\1.attn_ow"),
    (r"model\.towers\.layers\.(\d+)\.self_attn\.o_proj\.bias", r"trf_layers1.\1.attn_ob"),
    (r"model\.towers\.layers\.(\d+)\.post_attention_layernorm\.weight", r"trf_layers1.\1.norm_w"),
    (r"model\.towers\.layers\.(\d+)\.post_attention_layernorm\.bias", r"trf_layers1.\1.norm_b"),
    (r"model\.towers\.layers\.(\d+)\.mlp\.up_proj\.(weight|bias)", lambda m: f"trf_layers1.{m[1]}.inter_{m[2][0]}"),
    (r"model\.towers\.layers\.(\d+)\.mlp\.down_proj\.(weight|bias)", lambda m: f"trf_layers1.{m[1]}.output_{m[2][0]}"),
    (r"model\.fusion\.norm\.(weight|bias)", r"layer_norm_final.\1"),
    (r"lm_head\.dense\.(weight|bias)", r"dense_act.\1"),
    (r"lm_head\.norm\.(weight|bias)", r"layer_norm_trans.\1"),
    (r"lm_head\.decoder\.bias", "out_bias"),
    (r"probes\.dense\.(weight|bias)", r"dense_act1.\1"),
    (r"probes\.norm\.(weight|bias)", r"layer_norm_trans1.\1"),
    (r"probes\.decoder\.(weight|bias)", r"outnet1.\1"),
]


def reference_name(name: str) -> str:
    for pattern, replacement in REFERENCE_NAMES:
        if re.fullmatch(pattern, name):
            return re.sub(pattern, replacement, name)
    raise AssertionError(f"no reference name for {name}")


def reference_blocks(phase: str) -> tuple[int, int]:
    """(blocks read in all, blocks read while warming up) by the reference's `phase`, over all its processes."""
    schedule = REFERENCE_PHASES[phase]
    blocks_per_micro_batch = REFERENCE_MICRO_BATCH * REFERENCE_PROCESSES
    total = schedule["epochs"] * schedule["micro_batches_per_epoch"] * blocks_per_micro_batch
    return total, schedule["warmup_micro_batches"] * blocks_per_micro_batch


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_paper_recipes_read_as_many_blocks_as_the_reference(recipe):
    values = read_recipe(recipe)
    phase = values.get("phase", "pretrain")
    global_batch = values["per_device_train_batch_size"] * values["gradient_accumulation_steps"] * RECIPE_GPUS
    assert global_batch == REFERENCE_GLOBAL_BATCH
    total, warmup = reference_blocks(phase)
    assert (values["max_train_steps"] * global_batch, values["num_warmup_steps"] * global_batch) == (total, warmup)
    assert (total, warmup) == {"pretrain": (64_000_000, 5_120_000), "probe": (15_360_000, 512_000)}[phase]


@pytest.mark.parametrize("recipe", PAPER_RECIPES)
def test_paper_recipes_take_the_reference_hyper_parameters(recipe):
    values = read_recipe(recipe)
    assert {name: values[name] for name in ("learning_rate", "adam_beta1", "adam_beta2", "adam_epsilon",
                                            "weight_decay", "max_grad_norm", "lr_scheduler_type", "mixed_precision",
                                            "block_size", "block_format")} == {  # fmt: skip
        "learning_rate": 1e-3, "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-8, "weight_decay": 0.01,
        "max_grad_norm": 1.0, "lr_scheduler_type": "linear", "mixed_precision": "fp16", "block_size": 128,
        "block_format": "sentence_pairs",
    }  # fmt: skip
    family = FAMILIES[recipe.removesuffix("_probe")]
    assert values["weight_decay_exclude"] == {"bert": "tower_norms_and_biases", "gpt": "none", "elmo": "none"}[family]
    if values.get("phase") == "probe":  # one probe per run, its backbone in train mode (dslearn.py:273-274)
        assert values["probe_grad_clipping"] == "per_probe" and values["probe_backbone_dropout"] is True


@pytest.mark.parametrize("phase", ["pretrain", "probe"])
def test_learning_rate_follows_the_reference_schedule_in_micro_batches(phase):
    values = read_recipe({"pretrain": "base_masked", "probe": "base_masked_probe"}[phase])
    schedule = REFERENCE_PHASES[phase]
    total_micro_batches = schedule["epochs"] * schedule["micro_batches_per_epoch"]
    warmup = schedule["warmup_micro_batches"]

    def reference_learning_rate(micro_batch: int) -> float:  # ttlm/dslearn.py:177-183, lr_linear_decay 1.0
        if micro_batch < warmup:
            return micro_batch / warmup * 1e-3
        return (1 - (micro_batch - warmup) / (total_micro_batches - warmup)) * 1e-3

    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=values["learning_rate"])
    scheduler = get_scheduler(values["lr_scheduler_type"], optimizer, num_warmup_steps=values["num_warmup_steps"],
                              num_training_steps=values["max_train_steps"])  # fmt: skip
    # optimizer step k follows the reference's micro-batch 10 k (accumulation 10), from the first step to the last
    for step in [*range(0, values["max_train_steps"], 37), values["num_warmup_steps"], values["max_train_steps"] - 1]:
        learning_rate = values["learning_rate"] * scheduler.lr_lambdas[0](step)
        assert learning_rate == pytest.approx(reference_learning_rate(step * REFERENCE_ACCUMULATION), abs=1e-12)


def decayed_names(module: torch.nn.Module, exclude: str) -> tuple[set, set]:
    decay, no_decay = weight_decay_groups(module, 0.01, exclude)
    names = {id(param): name for name, param in module.named_parameters()}
    return {names[id(param)] for param in decay["params"]}, {names[id(param)] for param in no_decay["params"]}


@pytest.mark.parametrize("phase", ["pretrain", "probe"])
def test_masked_recipes_spare_the_parameters_the_reference_bert_spares(phase):
    exclude = read_recipe("base_masked" if phase == "pretrain" else "base_masked_probe")["weight_decay_exclude"]
    model = TwoTowerForMaskedLM(TwoTowerConfig.from_preset("tiny", vocab_size=64, num_hidden_layers=2))
    model.probes.requires_grad_(phase == "probe")
    trained = model if phase == "pretrain" else ProbesOnPositions(model.probes)
    decayed, spared = decayed_names(trained, exclude)
    spared_by_the_reference = {
        name for name in decayed | spared if any(part in reference_name(name) for part in REFERENCE_NO_DECAY)
    }
    assert spared == spared_by_the_reference
    if phase == "pretrain":  # the LayerNorms around the towers decay; those inside their layers do not
        assert {"model.embeddings.embed_norm.weight", "model.fusion.norm.weight", "lm_head.norm.weight"} <= decayed
        assert {"model.towers.layers.0.input_layernorm.weight", "model.towers.layers.1.post_attention_layernorm.weight"} <= spared
    else:
        assert decayed == {"probes.dense.weight", "probes.norm.weight", "probes.decoder.weight"}


@pytest.mark.parametrize("recipe", ["gpt_base", "base", "elmo_base", "gpt_base_probe", "elmo_base_probe"])
def test_gpt_and_elmo_recipes_decay_every_parameter(recipe):
    values = read_recipe(recipe)
    overrides = dict(tower_type="lstm", lstm_hidden_size=96) if recipe.startswith("elmo") else {}
    model_class = TwoTowerForMaskedLM if recipe.startswith("elmo") else TwoTowerForCausalLM
    model = model_class(TwoTowerConfig.from_preset("tiny", vocab_size=64, **overrides))
    trained = ProbesOnPositions(model.probes) if values.get("phase") == "probe" else model
    decayed, spared = decayed_names(trained, values["weight_decay_exclude"])
    assert not spared and decayed == {name for name, param in trained.named_parameters() if param.requires_grad}


def groups_by_module_walk(module: torch.nn.Module, exclude: str) -> tuple[list, list]:
    """The weight-decay groups as they were chosen before Trainer's name patterns: a walk over the named modules."""
    decay, no_decay, seen = [], [], set()
    for module_name, submodule in module.named_modules():
        is_norm = "norm" in module_name.rsplit(".", 1)[-1].lower()
        in_tower_layer = ".layers." in f".{module_name}."
        for name, param in submodule.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:
                continue
            seen.add(id(param))
            is_bias = name.startswith("bias")
            excluded = {"norms_and_biases": is_norm or is_bias,
                        "tower_norms_and_biases": (is_norm and in_tower_layer) or is_bias, "none": False}[exclude]
            (no_decay if excluded else decay).append(param)
    return decay, no_decay


LAYOUT_MODELS = {
    "bert": dict(),
    "bert-masked": dict(model_class=TwoTowerForMaskedLM),
    "bert-lstm": dict(tower_type="lstm", lstm_hidden_size=24),
    "bert-control": dict(cooperative=False),
    "bert-separate-embeddings": dict(separate_embeddings=True),
    "gpt": dict(layout="gpt"),
    "elmo": dict(layout="elmo", tower_type="lstm", lstm_hidden_size=24, model_class=TwoTowerForMaskedLM),
}


@pytest.mark.parametrize("layout", LAYOUT_MODELS)
@pytest.mark.parametrize("exclude", ["norms_and_biases", "tower_norms_and_biases", "none"])
@pytest.mark.parametrize("trains", ["model", "probes"])
def test_weight_decay_groups_are_those_of_the_module_walk(layout, exclude, trains):
    model = tiny_two_tower(**LAYOUT_MODELS[layout])
    model.probes.requires_grad_(trains == "probes")
    trained = model if trains == "model" else ProbesOnPositions(model.probes)
    decay, no_decay = weight_decay_groups(trained, 0.01, exclude)
    expected_decay, expected_no_decay = groups_by_module_walk(trained, exclude)
    # the same tensors, in the same order (the optimizer state's order in a checkpoint)
    assert [id(param) for param in decay["params"]] == [id(param) for param in expected_decay]
    assert [id(param) for param in no_decay["params"]] == [id(param) for param in expected_no_decay]
    assert no_decay["params"] or exclude == "none"
