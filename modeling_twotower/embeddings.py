"""
What the towers read of the token embedding they share (the base model's `embed_tokens`, tied to the decoder): one
class per layout, chosen once by `tower_embeddings`. Each returns (the embedding [batch, seq, embedding_size], the
towers' inputs) from the token embeddings, their positions and the token embedding itself.
"""

import torch
from torch import nn

from .batched_layers import TwoTowerBatchedLayerNorm, TwoTowerBatchedLinear, concat_towers, split_towers
from .configuration_twotower import TwoTowerConfig
from .dropout import Dropout


class TwoTowerEmbeddings(nn.Module):
    """
    The bert layout: token + position embedding, LayerNorm and dropout, then one projection per tower from the
    whole embedding to the tower's width; tower inputs [towers, batch, seq, hidden].
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.num_towers = config.num_towers
        self.dropout = Dropout(config.hidden_dropout)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        self.embed_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.tower_proj = TwoTowerBatchedLinear(config.num_towers, config.embedding_size, config.hidden_size)

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.LongTensor, token_embedding: nn.Embedding):
        embeddings = self.dropout(self.embed_norm(inputs_embeds + self.embed_positions(position_ids)))
        return embeddings, self.tower_proj(embeddings.expand(self.num_towers, *embeddings.shape))


class TwoTowerSeparateEmbeddings(nn.Module):
    """
    The bert layout with `separate_embeddings`: tower t reads columns [t * e, (t + 1) * e) of the embedding only,
    with its own LayerNorm and projection, so that independent towers share no weight.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.num_towers = config.num_towers
        self.dropout = Dropout(config.hidden_dropout)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.embedding_size)
        slice_size = config.embedding_size // config.num_towers
        self.embed_norm = TwoTowerBatchedLayerNorm(config.num_towers, slice_size, config.layer_norm_eps)
        self.tower_proj = TwoTowerBatchedLinear(config.num_towers, slice_size, config.hidden_size)

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.LongTensor, token_embedding: nn.Embedding):
        embeddings = inputs_embeds + self.embed_positions(position_ids)
        slices = self.dropout(self.embed_norm(split_towers(embeddings, self.num_towers)))
        return concat_towers(slices), self.tower_proj(slices)


class TwoTowerGPTEmbeddings(nn.Module):
    """
    The reference's GPT layout: token + position embedding, no norm, no projection; every tower reads it as it is
    and (a GPT2Model each in the reference) draws its own dropout mask.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.num_towers = config.num_towers
        self.dropout = Dropout(config.hidden_dropout)
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.embedding_size)

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.LongTensor, token_embedding: nn.Embedding):
        embeddings = inputs_embeds + self.embed_positions(position_ids)
        return embeddings, self.dropout(embeddings.expand(self.num_towers, *embeddings.shape))


class TwoTowerELMoEmbeddings(nn.Module):
    """
    The reference's ELMo layout: token embeddings only (no positions; norms and projections live in the ELMo
    towers). The towers' input is the embedding after one start symbol, [batch, 1 + seq, embedding_size], which
    each direction shifts by one; the reference's start symbol is [PAD] (id 0), the token embedding's row.
    """

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.start_id = 0 if config.pad_token_id is None else config.pad_token_id

    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.LongTensor, token_embedding: nn.Embedding):
        start = token_embedding.weight[self.start_id].expand(inputs_embeds.shape[0], 1, inputs_embeds.shape[-1])
        return inputs_embeds, torch.cat([start, inputs_embeds], dim=1)


def tower_embeddings(config: TwoTowerConfig) -> nn.Module:
    """The embedding module of the config's layout."""
    if config.layout == "elmo":
        return TwoTowerELMoEmbeddings(config)
    if config.layout == "gpt":
        return TwoTowerGPTEmbeddings(config)
    return TwoTowerSeparateEmbeddings(config) if config.separate_embeddings else TwoTowerEmbeddings(config)


__all__ = [
    "TwoTowerELMoEmbeddings",
    "TwoTowerEmbeddings",
    "TwoTowerGPTEmbeddings",
    "TwoTowerSeparateEmbeddings",
    "tower_embeddings",
]
