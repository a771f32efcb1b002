"""
Transformer towers: the batched decoder layers of `decoder_layers.py`, every tower at each depth at once; the only
kind that reads the attention mask, the cache and the positions.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import nn
from transformers import initialization as init
from transformers.masking_utils import (
    create_bidirectional_mask,
    create_causal_mask,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
)

from .batched_layers import TowerStackOutput, TwoTowerBatchedLayerNorm, TwoTowerBlockLinear, concat_towers
from .decoder_layers import TwoTowerDecoderLayer
from .tower_stack import TowerStack

if TYPE_CHECKING:  # the config reads the kinds (its choices), so a kind names the config in annotations only
    from .configuration_twotower import TwoTowerConfig


def _reference_block_linear_(module: TwoTowerBlockLinear, config: TwoTowerConfig) -> None:
    # DeepSpeed's kernel and GPT-2 alike: N(0, r), the residual writers scaled by 1/sqrt(2 L)
    depth_scale = 1 / math.sqrt(2 * config.num_hidden_layers) if module.writes_residual else 1.0
    init.normal_(module.weight, mean=0.0, std=config.initializer_range * depth_scale)
    init.zeros_(module.bias)


class TwoTowerTransformerTowers(TowerStack):
    """
    The towers' transformer layers, every tower at each depth at once, under one attention mask (causal or
    bidirectional); the GPT layout ends each tower with its own LayerNorm (GPT-2's ln_f).
    """

    tower_type = "transformer"
    layouts = ("bert", "gpt")
    size_fields = ("intermediate_size",)
    kind_name = "transformer"
    no_split_module = "TwoTowerDecoderLayer"
    has_cache = True
    has_attention = True
    sees_predicted_token = True  # bidirectional attention reads position t itself
    accepts_packed_rows = True
    reference_initializers = {TwoTowerBlockLinear: _reference_block_linear_}
    card_names = {False: "causal transformer (GPT-style)", True: "bidirectional transformer (BERT-style)"}
    card_size_rows = (
        ("Attention heads per tower", "num_attention_heads"),
        ("MLP width per tower (`intermediate_size`)", "intermediate_size"),
    )

    @classmethod
    def card_architecture(cls, config: TwoTowerConfig, bidirectional: bool) -> str:
        attention = "bidirectional" if bidirectional else "causal"
        if config.layout == "gpt":
            return f"a GPT-2 stack, {attention}, ending in its own LayerNorm"
        return f"a pre-LayerNorm {attention} transformer stack"

    def __init__(self, config: TwoTowerConfig, bidirectional: bool):
        super().__init__()
        self.config = config  # transformers' mask functions read it (attention implementation)
        self.bidirectional = bidirectional
        self.layers = nn.ModuleList(
            [TwoTowerDecoderLayer(config, layer_idx, bidirectional) for layer_idx in range(config.num_hidden_layers)]
        )
        self.tower_norm = (
            TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
            if config.layout == "gpt" else nn.Identity()
        )

    def forward(
        self, hidden_states, inputs_embeds, attention_mask=None, position_ids=None, cache=None,
        output_attentions=False, output_hidden_states=False,
    ) -> TowerStackOutput:
        mask = self._attention_mask(inputs_embeds, attention_mask, cache, position_ids, output_attentions)
        all_hidden_states, all_attentions = (), () if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_weights = layer(
                hidden_states, attention_mask=mask, cache=cache, output_attentions=output_attentions
            )
            if output_hidden_states:
                all_hidden_states += (concat_towers(hidden_states),)
            if output_attentions:
                all_attentions += (attn_weights,)
        return TowerStackOutput(self.tower_norm(hidden_states), all_hidden_states, all_attentions)

    def extra_flops_per_token(self, block_size: int) -> int:
        # attention scores and their weighted sum, nanoGPT's estimate (PaLM appendix B): 12 * layers * width * context
        return 12 * self.config.num_hidden_layers * self.config.num_towers * self.config.hidden_size * block_size

    def _attention_mask(self, inputs_embeds, attention_mask, cache, position_ids, output_attentions):
        # Attention weights come from the eager path, which needs the mask SDPA would skip.
        # Packed rows (position_ids restarting inside a row, no attention_mask) attend within each sequence, as in
        # transformers' own models; an empty cache holds no past, so it does not turn that off. `position_ids` are
        # the caller's, None when the model numbered the positions (no row is packed): under torch.compile, where
        # the check for packing cannot run, given positions always build a mask instead of SDPA's causal kernel.
        cache = cache if cache is not None and cache.get_seq_length() > 0 else None
        if self.bidirectional:
            packed = None
            if attention_mask is None and position_ids is not None:
                packed = find_packed_sequence_indices(position_ids.expand(inputs_embeds.shape[0], -1))
            return create_bidirectional_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=attention_mask,
                and_mask_function=None if packed is None else packed_sequence_mask_function(packed),
                allow_is_bidirectional_skip=not output_attentions,
            )
        return create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            cache=cache,
            position_ids=position_ids,
            allow_is_causal_skip=not output_attentions,
        )


__all__ = ["TwoTowerTransformerTowers"]
