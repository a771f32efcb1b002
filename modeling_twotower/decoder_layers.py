"""The transformer layers of the towers: attention, MLP and the pre-LN block, every tower at one depth at once.

Attention folds the towers into the head dimension, so one attention call (and one cache slot per depth) covers
every tower's heads, and towers never exchange information. Training on the CPU with attention dropout, attention
runs a tower at a time instead, to the same bits (`tower_at_a_time_attention`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBlockLinear
from .dropout import Dropout

if TYPE_CHECKING:  # the config reads the tower kinds (its choices), so their layers name it in annotations only
    from .configuration_twotower import TwoTowerConfig


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    # query [batch, towers * heads, q_len, head_dim]; key, value [batch, towers * heads, kv_len, head_dim]
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # an SDPA-style mask: True = attend
        attn_weights = attn_weights.masked_fill(~attention_mask, torch.finfo(attn_weights.dtype).min)
    elif attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    # half precision softmaxes in float32; float64 stays float64 (its mask minimum is -inf in float32, which turned
    # a fully masked row, a left-padded one's first positions, into NaN)
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.promote_types(attn_weights.dtype, torch.float32))
    attn_weights = attn_weights.to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


def tower_at_a_time_attention(query, key, value, scaling, dropout, is_causal):
    """
    Attention with dropout as torch's math kernel computes it, the one `scaled_dot_product_attention` runs on the
    CPU when dropout is on, a tower at a time; query, key, value [towers, batch, heads, seq, head_dim] ->
    [towers, batch, seq, heads * head_dim].

    Why: folded into one call, every tower's scores, weights and dropout noise are one [batch, towers * heads, seq,
    seq] tensor, twice a one-tower model's, and on the CPU such tensors fall out of the cache (docs/speed.md). The
    noise is drawn once over all towers' heads, as the single call drew it, and the ops are the kernel's, so values,
    gradients and dropout masks are bitwise those of the single call.
    """
    num_towers, batch, heads, seq, head_dim = query.shape
    # each tower's heads laid out as in the folded call, so that its matmuls take the same kernels: other layouts
    # (the projections' [towers, batch, seq, heads, head_dim] transposed) round differently
    query, key, value = query.contiguous(), key.contiguous(), value.contiguous()
    scale_root = math.sqrt(scaling)  # the math kernel scales query and key by the root each
    noise = torch.empty(batch, num_towers * heads, seq, seq, dtype=query.dtype, device=query.device)
    noise = noise.bernoulli_(1 - dropout).div_(1 - dropout).view(batch, num_towers, heads, seq, seq)
    causal_mask = None
    if is_causal and seq > 1:  # 0 where a position may attend, -inf where not, as the kernel builds it
        future = torch.ones(seq, seq, dtype=torch.bool, device=query.device).triu(1)
        causal_mask = torch.zeros(seq, seq, dtype=query.dtype, device=query.device).masked_fill_(future, -math.inf)
    outputs = []
    for tower in range(num_towers):
        scores = torch.matmul(query[tower] * scale_root, key[tower].transpose(-2, -1) * scale_root)
        if causal_mask is not None:
            scores.add_(causal_mask)
        weights = F.softmax(scores, dim=-1) * noise[:, tower]  # no row is all -inf: softmax is the kernel's safe one
        outputs.append(torch.matmul(weights, value[tower]).transpose(1, 2))  # [batch, seq, heads, head_dim]
    return torch.stack(outputs).view(num_towers, batch, seq, heads * head_dim)  # one copy, into the output's layout


class TwoTowerAttention(nn.Module):
    """Self-attention (causal or bidirectional) of every tower at one depth, the towers folded into the heads."""

    def __init__(self, config: TwoTowerConfig, layer_idx: int, bidirectional: bool):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_towers = config.num_towers
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        self.is_causal = not bidirectional
        self.q_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.hidden_size)
        self.k_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.hidden_size)
        self.v_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.hidden_size)
        self.o_proj = TwoTowerBlockLinear(
            config.num_towers, config.hidden_size, config.hidden_size, writes_residual=True
        )

    def _to_heads(self, states: torch.Tensor) -> torch.Tensor:
        # [towers, batch, seq, hidden] -> [batch, towers * heads, seq, head_dim], tower-major head order
        num_towers, batch, seq, _ = states.shape
        states = states.view(num_towers, batch, seq, -1, self.head_dim).permute(1, 0, 3, 2, 4)
        return states.reshape(batch, -1, seq, self.head_dim)

    def _runs_a_tower_at_a_time(self, query, attention_mask, cache, implementation) -> bool:
        # where `tower_at_a_time_attention` is bitwise SDPA's: its math kernel (the CPU's, with dropout), at full
        # precision, without a mask or cache. Compiled, it is traced like any other code; a compiled step is faster
        # with it than with the single call (docs/speed.md)
        return (
            implementation == "sdpa" and self.training and self.config.attention_dropout > 0
            and query.device.type == "cpu" and query.dtype in (torch.float32, torch.float64)
            and attention_mask is None and cache is None
        )  # fmt: skip

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False, **kwargs):
        num_towers, batch, seq, hidden = hidden_states.shape
        query, key, value = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        # Attention weights exist only on the eager path; interpretability users ask for them explicitly.
        implementation = "eager" if output_attentions else self.config._attn_implementation
        if self._runs_a_tower_at_a_time(query, attention_mask, cache, implementation):
            per_tower_heads = (num_towers, batch, seq, -1, self.head_dim)
            query, key, value = (states.view(per_tower_heads).transpose(2, 3) for states in (query, key, value))
            attn_output = tower_at_a_time_attention(
                query, key, value, self.scaling, self.config.attention_dropout, self.is_causal
            )
            return self.o_proj(attn_output), None

        query, key, value = self._to_heads(query), self._to_heads(key), self._to_heads(value)
        if cache is not None:
            key, value = cache.update(key, value, self.layer_idx)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        # [batch, seq, towers * heads, head_dim] -> [towers, batch, seq, hidden]
        attn_output = attn_output.reshape(batch, seq, num_towers, hidden).permute(2, 0, 1, 3)
        return self.o_proj(attn_output), attn_weights


class TwoTowerMLP(nn.Module):
    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.up_proj = TwoTowerBlockLinear(config.num_towers, config.hidden_size, config.intermediate_size)
        self.down_proj = TwoTowerBlockLinear(
            config.num_towers, config.intermediate_size, config.hidden_size, writes_residual=True
        )
        self.act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states):
        return self.down_proj(self.act_fn(self.up_proj(hidden_states)))


class TwoTowerDecoderLayer(GradientCheckpointingLayer):
    """Pre-LN transformer block at one depth of every tower; hidden states [towers, batch, seq, hidden]."""

    def __init__(self, config: TwoTowerConfig, layer_idx: int, bidirectional: bool):
        super().__init__()
        self.input_layernorm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        self.self_attn = TwoTowerAttention(config, layer_idx, bidirectional)
        self.post_attention_layernorm = TwoTowerBatchedLayerNorm(
            config.num_towers, config.hidden_size, config.layer_norm_eps
        )
        self.mlp = TwoTowerMLP(config)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, hidden_states, attention_mask=None, cache=None, output_attentions=False, **kwargs):
        # Self Attention
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states)
        hidden_states, attn_weights = self.self_attn(hidden_states, attention_mask, cache, output_attentions)
        hidden_states = residual + self.dropout(hidden_states)

        # Fully Connected
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        hidden_states = residual + self.dropout(hidden_states)
        return hidden_states, attn_weights


__all__ = [
    "TwoTowerAttention", "TwoTowerDecoderLayer", "TwoTowerMLP", "eager_attention_forward", "tower_at_a_time_attention"
]
