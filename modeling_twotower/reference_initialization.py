"""The reference code's initialisation (`initialization="reference"`): each weight kind drawn as the reference's
BERT, GPT-2 or ELMo model draws it, instead of transformers' N(0, initializer_range) for every matrix."""

import math

import torch
from torch import nn
from transformers import initialization as init

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear, TwoTowerBlockLinear
from .configuration_twotower import TwoTowerConfig


def _torch_default_linear_(weight: torch.Tensor, bias: torch.Tensor, in_features: int):
    # nn.Linear's own initialisation (kaiming_uniform with a = sqrt(5)) is U(+-1/sqrt(fan_in)), for the bias too
    bound = 1 / math.sqrt(in_features)
    init.uniform_(weight, -bound, bound)
    init.uniform_(bias, -bound, bound)


def init_reference_weights(module: nn.Module, config: TwoTowerConfig, decoder: nn.Module | None):
    """
    The reference code's initialisation of `module` (the table in TwoTowerConfig's docstring). `decoder` is the
    model's tied decoder (its weight is the shared embedding), or None.
    """
    std = config.initializer_range
    is_decoder = module is decoder
    if isinstance(module, nn.Embedding) or is_decoder:
        if config.layout == "gpt":  # GPT-2's _init_weights
            init.normal_(module.weight, mean=0.0, std=std)
        else:  # the reference's pt_emb / position_embeddings: .uniform_(-0.02, 0.02)
            init.uniform_(module.weight, -std, std)
    if is_decoder:
        init.zeros_(module.bias)  # the output bias
    elif isinstance(module, nn.Embedding):
        if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
            init.zeros_(module.weight[module.padding_idx])
    elif isinstance(module, nn.Linear):
        _torch_default_linear_(module.weight, module.bias, module.in_features)
    elif isinstance(module, TwoTowerBlockLinear):
        # DeepSpeed's kernel and GPT-2 alike: N(0, std), the residual writers scaled by 1/sqrt(2 L)
        depth_scale = 1 / math.sqrt(2 * config.num_hidden_layers) if module.writes_residual else 1.0
        init.normal_(module.weight, mean=0.0, std=std * depth_scale)
        init.zeros_(module.bias)
    elif isinstance(module, TwoTowerBatchedLinear):  # the per-tower projections and the probes: plain nn.Linear
        _torch_default_linear_(module.weight, module.bias, module.weight.shape[1])
    elif isinstance(module, nn.LSTM):
        for param in module.parameters():  # nn.LSTM's own initialisation
            init.uniform_(param, -1 / math.sqrt(module.hidden_size), 1 / math.sqrt(module.hidden_size))
    elif isinstance(module, (nn.LayerNorm, TwoTowerBatchedLayerNorm)):
        init.ones_(module.weight)
        init.zeros_(module.bias)


__all__ = ["init_reference_weights"]
