"""Layers that run every tower at once (each tower's weights stacked along a leading tower dimension), and the
two layouts of the towers' hidden states: stacked [towers, ...] and concatenated [..., towers * hidden], and what a
tower stack returns."""

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F


class TwoTowerBatchedLinear(nn.Module):
    """
    `num_towers` independent linear layers applied as one batched matmul; weight [towers, in, out].

    The weight is stored input-major (GPT-2's Conv1D layout), so that the batched matmul and its weight
    gradient need no transposed copy.
    """

    def __init__(self, num_towers: int, in_features: int, out_features: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_towers, in_features, out_features))
        self.bias = nn.Parameter(torch.empty(num_towers, out_features))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [towers, ..., in] -> [towers, ..., out]
        num_towers, *middle, in_features = hidden_states.shape
        flat = hidden_states.reshape(num_towers, math.prod(middle), in_features)  # explicit sizes: a dimension may be 0
        out = torch.baddbmm(self.bias.unsqueeze(1), flat, self.weight)
        return out.view(num_towers, *middle, self.weight.shape[-1])


class TwoTowerBlockLinear(TwoTowerBatchedLinear):
    """
    A batched linear layer of a transformer block. `writes_residual` marks the attention and MLP output
    projections, whose reference initialisation shrinks with depth (see TwoTowerConfig).
    """

    def __init__(self, num_towers: int, in_features: int, out_features: int, writes_residual: bool = False):
        super().__init__(num_towers, in_features, out_features)
        self.writes_residual = writes_residual


class TwoTowerBatchedLayerNorm(nn.Module):
    """One LayerNorm per tower; weight and bias [towers, hidden]."""

    def __init__(self, num_towers: int, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_towers, hidden_size))
        self.bias = nn.Parameter(torch.zeros(num_towers, hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [towers, ..., hidden]
        shape = (hidden_states.shape[0],) + (1,) * (hidden_states.dim() - 2) + (hidden_states.shape[-1],)
        normalized = F.layer_norm(hidden_states, hidden_states.shape[-1:], eps=self.eps)
        return normalized * self.weight.view(shape) + self.bias.view(shape)


class TowerStackOutput(NamedTuple):
    """What every tower stack returns (`towers.py`)."""

    last_hidden_state: torch.Tensor  # [towers, batch, seq, hidden]
    hidden_states: tuple  # each depth's output [batch, seq, towers * hidden], if asked for; else empty
    attentions: tuple | None  # each depth's attention weights, if asked for


def concat_towers(hidden_states: torch.Tensor) -> torch.Tensor:
    # [towers, batch, seq, hidden] -> [batch, seq, towers * hidden], tower 0 first
    num_towers, batch, seq, hidden = hidden_states.shape
    return hidden_states.permute(1, 2, 0, 3).reshape(batch, seq, num_towers * hidden)


def split_towers(fused_hidden_states: torch.Tensor, num_towers: int) -> torch.Tensor:
    # [batch, seq, towers * hidden] -> [towers, batch, seq, hidden], a view
    batch, seq, _ = fused_hidden_states.shape
    return fused_hidden_states.view(batch, seq, num_towers, -1).permute(2, 0, 1, 3)


__all__ = ["TwoTowerBatchedLayerNorm", "TwoTowerBatchedLinear", "TwoTowerBlockLinear", "concat_towers", "split_towers"]
