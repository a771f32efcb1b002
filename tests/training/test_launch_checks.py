"""What a launch gives a run: one precision source, every process seen, a distributed type the phase can use."""

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from torch.distributed.tensor import Shard

import modeling_twotower
from twotower.training.arguments import load_config
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.launch.launch_checks import LAUNCH_PRECISION_VARIABLE, check_launch, resolve_mixed_precision
from twotower.training.phases import make_phase
from twotower.training.launch.sharding import tower_placement


@pytest.mark.parametrize(
    "recipe_value, launched, expected",
    [
        (None, None, (None, "the default")),
        (None, "bf16", ("bf16", "the accelerate launch")),
        ("fp16", None, ("fp16", "--mixed_precision")),
        ("bf16", "bf16", ("bf16", "--mixed_precision")),
    ],
)
def test_one_source_of_mixed_precision(recipe_value, launched, expected, monkeypatch):
    monkeypatch.delenv(LAUNCH_PRECISION_VARIABLE, raising=False)
    if launched is not None:
        monkeypatch.setenv(LAUNCH_PRECISION_VARIABLE, launched)
    options = [] if recipe_value is None else [f"--mixed_precision={recipe_value}"]
    assert resolve_mixed_precision(load_config("tiny", options)) == expected


def test_a_recipe_precision_that_disagrees_with_the_launch_is_refused(monkeypatch):
    # base.yaml says fp16 (the reference's); the shipped accelerate configs say bf16
    monkeypatch.setenv(LAUNCH_PRECISION_VARIABLE, "bf16")
    with pytest.raises(TwoTowerUserError, match=r"--mixed_precision fp16 \(recipe base .*disagrees with the "
                                                r"accelerate launch's mixed_precision bf16.*pass --mixed_precision bf16"):
        resolve_mixed_precision(load_config("base"))


def launched_accelerator(num_processes: int, distributed_type=DistributedType.MULTI_CPU):
    return SimpleNamespace(num_processes=num_processes, distributed_type=distributed_type)


def test_processes_that_accelerate_does_not_see_are_refused(monkeypatch):
    # `accelerate launch --config_file ddp.yaml` on a machine without GPUs: torchrun starts 2 processes, and each,
    # without --cpu, finds no GPU and trains alone
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TwoTowerUserError, match=r"2 processes were launched \(WORLD_SIZE=2\) but Accelerate sees 1 "
                                                r".*add --cpu true to the training command"):
        check_launch(launched_accelerator(1, DistributedType.NO))
    check_launch(launched_accelerator(2))


def test_the_probe_phase_refuses_fsdp(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(TwoTowerUserError, match="probe phase.*ddp.yaml"):
        make_phase(load_config("tiny_probe")).check_accelerator(launched_accelerator(1, DistributedType.FSDP))
    make_phase(load_config("tiny")).check_accelerator(launched_accelerator(1, DistributedType.FSDP))


@pytest.mark.parametrize(
    "model_class, options, stack",
    [
        (modeling_twotower.TwoTowerForCausalLM, {}, "TwoTowerDecoderLayer"),
        (modeling_twotower.TwoTowerForCausalLM, {"tower_type": "lstm"}, "TwoTowerLSTMTowers"),
        (modeling_twotower.TwoTowerForMaskedLM, {"layout": "elmo"}, "TwoTowerELMoTowers"),
    ],
)
def test_the_unsplit_modules_are_the_stack_the_model_holds(model_class, options, stack):
    # FSDP's transformer wrap policy (and device_map) refuse a class name that the model does not contain
    model = model_class(modeling_twotower.TwoTowerConfig.from_preset("tiny", vocab_size=64, **options))
    assert model._no_split_modules == {stack}
    assert any(type(module).__name__ == stack for module in model.modules())


def test_batched_tower_weights_shard_off_the_tower_axis():
    # [towers, in, out] split on the towers' axis would give 2 of 4 ranks all of it
    placement = tower_placement(num_towers=2, world_size=4)
    assert placement(torch.nn.Parameter(torch.empty(2, 64, 256))) == Shard(2)  # the largest axis 4 ranks divide
    assert placement(torch.nn.Parameter(torch.empty(2, 64, 6))) == Shard(1)
    assert placement(torch.nn.Parameter(torch.empty(2, 6, 6))) == Shard(0)  # FSDP2 pads only axis 0
    assert placement(torch.nn.Parameter(torch.empty(512, 64))) == Shard(0)  # not a tower weight: the embedding
    assert placement(torch.nn.Parameter(torch.empty(64))) == Shard(0)
