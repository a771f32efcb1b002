"""How FSDP shards a two-tower model: gradients reduced in float32, and modules that do not train left out."""

import dataclasses

import torch
from accelerate.utils import DistributedType
from torch import nn


def configure_fsdp(accelerator, model: nn.Module) -> None:
    """
    Before `prepare`: reduce gradients in float32 under bf16/fp16 (accelerate's policy reduces in the parameter
    dtype, which rounds each rank's contribution to 8 bits of mantissa in bf16), and leave the frozen modules (the
    probes while pretraining) out of the shards, so that no step gathers weights it does not train.
    """
    if accelerator.distributed_type != DistributedType.FSDP:
        return
    plugin = accelerator.state.fsdp_plugin
    if plugin.mixed_precision_policy is not None:
        plugin.mixed_precision_policy = dataclasses.replace(plugin.mixed_precision_policy, reduce_dtype=torch.float32)
    frozen = [module for module in model.children() if not any(param.requires_grad for param in module.parameters())]
    if frozen:
        plugin.ignored_modules = frozen
