"""
The reference code's ELMo layout (`layout="elmo"`): per tower a forward and a backward LM, the paper's 2 LSTM layers
of width 256 with cells of 2048 or 4096.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .dropout import Dropout
from .reference_initialization import torch_default_lstm_
from .tower_stack import TowerStack, stack_output

if TYPE_CHECKING:  # the config reads the kinds (its choices), so a kind names the config in annotations only
    from .configuration_twotower import TwoTowerConfig


def _unprojected_lstm(config: TwoTowerConfig) -> nn.LSTM:
    # the reference's nn.LSTM(model width, cells, num_layers): no projection inside, no dropout between layers
    return nn.LSTM(config.hidden_size // 2, config.lstm_hidden_size, config.num_hidden_layers, batch_first=True)


def _direction_linears(config: TwoTowerConfig, in_features: int) -> nn.ModuleList:
    return nn.ModuleList([nn.Linear(in_features, config.hidden_size // 2) for _ in range(config.num_towers)])


class TwoTowerELMoTowers(TowerStack):
    """
    The reference code's ELMo layout (TwoTowerELMo): the token embeddings after one start symbol [batch, 1 + seq,
    embedding_size] in (`TwoTowerELMoEmbeddings`), each tower's [forward; backward] features [towers, batch, seq,
    hidden] out.

    Each direction reads the embeddings shifted by the start symbol (the forward LM reads tokens < t, the backward
    LM, run on the reversed sequence, tokens > t), normalized by that direction's LayerNorm and dropped out. Each
    tower projects both streams with its one Linear(embedding_size -> hidden // 2), runs a forward and a backward
    unprojected LSTM, and maps the cells back with one Linear(cells -> hidden // 2) per direction. The towers run
    one after the other, as cuDNN/oneDNN LSTM kernels take one sequence batch per call.
    """

    tower_type = "lstm"  # the lstm kind's stack in the ELMo layout (TwoTowerLSTMTowers.stack_class)
    directions = (True,)  # a forward and a backward LM: the masked family only
    size_fields = ("lstm_hidden_size",)
    kind_name = "LSTM"
    no_split_module = "TwoTowerELMoTowers"
    reference_initializers = {nn.LSTM: torch_default_lstm_}
    card_names = {True: "forward + backward LSTM (ELMo-style)"}
    card_size_rows = (
        ("LSTM cell size (`lstm_hidden_size`), projected back to the tower width (half of it per direction)",
         "lstm_hidden_size"),
    )  # fmt: skip
    card_limitations = {
        True: "The towers are ELMo-style LSTMs; the paper reports the preference for this family alongside its BERT "
        "and GPT ones, and its strength need not match theirs.",
    }
    card_tags = ("lstm",)

    @classmethod
    def card_architecture(cls, config: TwoTowerConfig, bidirectional: bool) -> str:
        return (
            "a forward and a backward language model, each direction a LayerNorm, the tower's linear projection, an "
            "unprojected multi-layer LSTM and a linear map back to half the tower width; position t reads the "
            "forward LM after t - 1 and the backward LM after t + 1, never token t itself"
        )

    def __init__(self, config: TwoTowerConfig, bidirectional: bool):
        # bidirectional is True, its only direction (`directions`): every stack is built with it
        super().__init__()
        self.forward_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.backward_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout)
        self.tower_proj = _direction_linears(config, config.embedding_size)  # one per tower, shared by directions
        self.forward_lstms = nn.ModuleList([_unprojected_lstm(config) for _ in range(config.num_towers)])
        self.backward_lstms = nn.ModuleList([_unprojected_lstm(config) for _ in range(config.num_towers)])
        self.forward_out_proj = _direction_linears(config, config.lstm_hidden_size)
        self.backward_out_proj = _direction_linears(config, config.lstm_hidden_size)

    def forward(self, embeddings_after_start: torch.Tensor, output_hidden_states: bool = False, **attention_inputs):
        # attention_inputs (mask, cache, positions) do not apply to LSTMs
        start, inputs_embeds = embeddings_after_start[:, :1], embeddings_after_start[:, 1:]
        # position t of the forward stream holds token t - 1; of the backward stream, token seq - t (reversed)
        forward_inputs = embeddings_after_start[:, :-1]
        backward_inputs = torch.cat([start, inputs_embeds.flip(1)[:, :-1]], dim=1)
        forward_inputs = self.dropout(self.forward_norm(forward_inputs))
        backward_inputs = self.dropout(self.backward_norm(backward_inputs))
        outputs = []
        for tower_idx, tower_proj in enumerate(self.tower_proj):
            left_to_right, _ = self.forward_lstms[tower_idx](tower_proj(forward_inputs))
            right_to_left, _ = self.backward_lstms[tower_idx](tower_proj(backward_inputs))
            left_context = self.forward_out_proj[tower_idx](left_to_right)  # [batch, seq, hidden // 2]
            right_context = self.backward_out_proj[tower_idx](right_to_left).flip(1)
            outputs.append(torch.cat([left_context, right_context], dim=-1))
        return stack_output(torch.stack(outputs), output_hidden_states)  # [towers, batch, seq, hidden]


__all__ = ["TwoTowerELMoTowers"]
