"""The reference code's initialisation (`initialization="reference"`): each weight kind drawn as the reference's
BERT, GPT-2 or ELMo model draws it, instead of transformers' N(0, initializer_range) for every matrix. The layers
every tower kind shares are drawn here; a kind's own layers by its `reference_initializers` (tower_stack.py)."""

import math

import torch
from torch import nn
from transformers import initialization as init

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear
from .tower_stack import TowerStack


def torch_default_(weight: torch.Tensor, bias: torch.Tensor | None, fan_in: int):
    # nn.Linear's and nn.Conv1d's own initialisation (kaiming_uniform with a = sqrt(5)) is U(+-1/sqrt(fan_in)), for
    # the bias too; a layer built without a bias (Mamba's projections) draws its weight only
    bound = 1 / math.sqrt(fan_in)
    init.uniform_(weight, -bound, bound)
    if bias is not None:
        init.uniform_(bias, -bound, bound)


def torch_default_lstm_(module: nn.LSTM, config) -> None:
    """nn.LSTM's own initialisation: every weight and bias U(+-1/sqrt(cells))."""
    for param in module.parameters():
        init.uniform_(param, -1 / math.sqrt(module.hidden_size), 1 / math.sqrt(module.hidden_size))


def init_reference_weights(module: nn.Module, config, decoder: nn.Module | None, towers: type[TowerStack]) -> None:
    """
    The reference code's initialisation of `module` (the table in TwoTowerConfig's docstring). `decoder` is the
    model's tied decoder (its weight is the shared embedding), or None; `towers` the model's TowerStack class, whose
    `reference_initializers` draw the kind's own layers.
    """
    for layer_type, initializer in towers.reference_initializers.items():
        if isinstance(module, layer_type):
            initializer(module, config)
            return
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
        torch_default_(module.weight, module.bias, module.in_features)
    elif isinstance(module, TwoTowerBatchedLinear):  # the per-tower projections and the probes: plain nn.Linear
        torch_default_(module.weight, module.bias, module.weight.shape[1])
    elif isinstance(module, (nn.LayerNorm, TwoTowerBatchedLayerNorm)):
        init.ones_(module.weight)
        init.zeros_(module.bias)


__all__ = ["init_reference_weights", "torch_default_", "torch_default_lstm_"]
