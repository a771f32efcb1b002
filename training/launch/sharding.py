"""
How FSDP shards a two-tower model: each tower stack on an axis that every rank gets a share of, gradients reduced
in float32, and modules that do not train left out.
"""

import dataclasses

import torch
from accelerate.utils import DistributedType
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import Shard


def tower_placement(num_towers: int, world_size: int):
    """
    FSDP's `shard_placement_fn`. A batched tower weight is [towers, ...]: split on that first axis (FSDP's default),
    2 towers give all of a weight to 2 ranks and none to the rest, so memory per rank stops falling beyond 2
    ranks. It is split instead on its largest other axis that the ranks divide evenly (FSDP2 pads only axis 0).
    """

    def placement(param: nn.Parameter) -> Shard:
        if param.dim() < 2 or param.shape[0] != num_towers:
            return Shard(0)
        axes = [axis for axis in range(1, param.dim()) if param.shape[axis] % world_size == 0]
        return Shard(max(axes, key=lambda axis: param.shape[axis])) if axes else Shard(0)

    return placement


def configure_fsdp(accelerator, model: nn.Module) -> None:
    """
    Before `prepare`: reduce gradients in float32 under bf16/fp16 (accelerate's policy reduces in the parameter
    dtype, which rounds each rank's contribution to 8 bits of mantissa in bf16), leave the frozen modules (the probes
    while pretraining) out of the shards, so that no step gathers weights it does not train, and shard each unit of
    the tower stack (model._no_split_modules) across the towers' other axes; accelerate wraps the rest.
    """
    if accelerator.distributed_type != DistributedType.FSDP:
        return
    plugin = accelerator.state.fsdp_plugin
    if plugin.mixed_precision_policy is not None:
        plugin.mixed_precision_policy = dataclasses.replace(plugin.mixed_precision_policy, reduce_dtype=torch.float32)
    frozen = [module for module in model.children() if not any(param.requires_grad for param in module.parameters())]
    if frozen:
        plugin.ignored_modules = frozen
    units = [module for module in model.modules() if type(module).__name__ in model._no_split_modules]
    placement = tower_placement(model.config.num_towers, accelerator.num_processes)
    for unit in units:
        fully_shard(unit, reshard_after_forward=plugin.reshard_after_forward, offload_policy=plugin.cpu_offload,
                    mp_policy=plugin.mixed_precision_policy or MixedPrecisionPolicy(), shard_placement_fn=placement)
    # Sharded, a unit's class is FSDP's subclass (FSDPTwoTowerDecoderLayer): accelerate's wrap policy, which looks the
    # names up, must find those, and wraps them no further
    plugin.transformer_cls_names_to_wrap = sorted({type(unit).__name__ for unit in units})
