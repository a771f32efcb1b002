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


def _per_tower(parameter: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
    # [towers, hidden] -> [towers, 1, ..., 1, hidden], broadcasting over hidden_states [towers, ..., hidden]
    return parameter.view((parameter.shape[0],) + (1,) * (hidden_states.dim() - 2) + (parameter.shape[-1],))


def _batched_layer_norm(hidden_states, weight, bias, eps):
    normalized = F.layer_norm(hidden_states, hidden_states.shape[-1:], eps=eps)
    return normalized * _per_tower(weight, hidden_states) + _per_tower(bias, hidden_states)


def _unit_affine(hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # The CPU's layer_norm kernel vectorizes its output only when given both a weight and a bias: with ones and zeros
    # it normalizes to the same bits as with none (x * 1 + 0) in half the time (tests/modeling/test_batched_layers.py)
    size = hidden_states.shape[-1:]
    return hidden_states.new_ones(size), hidden_states.new_zeros(size)


class BatchedLayerNorm(torch.autograd.Function):
    """
    `_batched_layer_norm` with the same values and gradients, keeping only its input for backward. Under autograd
    the composite kept the normalized states too, for the weight's gradient: one more [towers, ..., hidden] tensor
    per LayerNorm at a training step's peak, which on the CPU cost every step the page faults of a heap grown again
    (docs/speed.md). Backward normalizes once more instead.
    """

    @staticmethod
    def forward(ctx, hidden_states, weight, bias, eps):
        shape = hidden_states.shape[-1:]
        normalized = F.layer_norm(hidden_states, shape, *_unit_affine(hidden_states), eps)  # autocast: float32
        ctx.save_for_backward(hidden_states, weight, bias)
        ctx.eps, ctx.normalized_dtype = eps, normalized.dtype
        return (normalized * _per_tower(weight, hidden_states)).add_(_per_tower(bias, hidden_states))

    @staticmethod
    def backward(ctx, output_grad):
        hidden_states, weight, bias = ctx.saved_tensors
        hidden_states = hidden_states.to(ctx.normalized_dtype)  # as autocast cast it forward
        if torch.is_grad_enabled():  # create_graph: the composite's own backward, differentiable again
            return _composite_grads(ctx, output_grad, hidden_states, weight, bias)
        # the ops, and so the rounding, of autograd over the composite
        shape = hidden_states.shape[-1:]
        normalized, mean, rstd = torch.native_layer_norm(hidden_states, shape, *_unit_affine(hidden_states), ctx.eps)
        input_grad = weight_grad = bias_grad = None
        if ctx.needs_input_grad[0]:
            normalized_grad = (output_grad * _per_tower(weight, output_grad)).to(normalized.dtype)
            input_grad = torch.ops.aten.native_layer_norm_backward(
                normalized_grad, hidden_states, shape, mean, rstd, None, None, [True, False, False]
            )[0]
        if ctx.needs_input_grad[1]:
            weight_grad = _sum_over_positions(output_grad * normalized).view(weight.shape)
        if ctx.needs_input_grad[2]:
            bias_grad = _sum_over_positions(output_grad).view(bias.shape)
        return input_grad, weight_grad, bias_grad, None


def _sum_over_positions(states: torch.Tensor) -> torch.Tensor:
    # [towers, ..., hidden] -> [towers, hidden]; an empty dim list would sum everything
    dims = tuple(range(1, states.dim() - 1))
    return states.sum(dims) if dims else states


def _composite_grads(ctx, output_grad, hidden_states, weight, bias):
    inputs = [t for t, needed in zip((hidden_states, weight, bias), ctx.needs_input_grad) if needed]
    output = _batched_layer_norm(hidden_states, weight, bias, ctx.eps)
    grads = iter(torch.autograd.grad(output, inputs, output_grad, create_graph=True))
    return tuple(next(grads) if needed else None for needed in ctx.needs_input_grad[:3]) + (None,)


class TwoTowerBatchedLayerNorm(nn.Module):
    """One LayerNorm per tower; weight and bias [towers, hidden]."""

    def __init__(self, num_towers: int, hidden_size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(num_towers, hidden_size))
        self.bias = nn.Parameter(torch.zeros(num_towers, hidden_size))
        self.eps = eps

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # [towers, ..., hidden]
        return BatchedLayerNorm.apply(hidden_states, self.weight, self.bias, self.eps)


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
