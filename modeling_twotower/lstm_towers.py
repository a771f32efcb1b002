"""
LSTM towers of the two-tower model: the reference code's ELMo layout (`layout="elmo"`: the paper's 2 LSTM layers
of width 256 with cells of 2048 or 4096) and this package's own LSTM stacks in the bert layout (`tower_type="lstm"`).
"""

import torch
from torch import nn
from torch.nn import functional as F

from .batched_layers import TowerStackOutput, concat_towers
from .configuration_twotower import TwoTowerConfig


def _stack_output(hidden_states: torch.Tensor, output_hidden_states: bool) -> TowerStackOutput:
    # no attention, one hidden state: the stack's output
    return TowerStackOutput(hidden_states, (concat_towers(hidden_states),) if output_hidden_states else (), None)


def _tower_lstm(config: TwoTowerConfig) -> nn.LSTM:
    # Cells of lstm_hidden_size, projected back to the tower width (proj_size), as in ELMo; cells as wide as the
    # tower need no projection (and then run oneDNN's LSTM kernel on CPUs, ~4x faster: it has none with one).
    projected = config.lstm_hidden_size > config.hidden_size
    return nn.LSTM(
        input_size=config.hidden_size,
        hidden_size=config.lstm_hidden_size,
        num_layers=config.num_hidden_layers,
        proj_size=config.hidden_size if projected else 0,
        dropout=config.hidden_dropout if config.num_hidden_layers > 1 else 0.0,
        batch_first=True,
    )


class TwoTowerLSTMTowers(nn.Module):
    """
    The bert layout's LSTM towers: each tower's multi-layer LSTM; hidden states [towers, batch, seq, hidden] in and out.

    Causal (`bidirectional=False`): position t is the forward LSTM's state after token t (it predicts t + 1).
    Bidirectional (ELMo-style): each tower also runs a backward LSTM, and position t combines the forward
    state at t - 1 with the backward state at t + 1, so the prediction for token t never reads token t.

    cuDNN/oneDNN LSTM kernels take one sequence batch per call, so the towers run one after the other here;
    this is the only place in the model where towers are a Python loop.
    """

    no_split_module = "TwoTowerLSTMTowers"  # what device maps and FSDP keep whole

    def __init__(self, config: TwoTowerConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.forward_lstms = nn.ModuleList([_tower_lstm(config) for _ in range(config.num_towers)])
        if self.bidirectional:
            self.backward_lstms = nn.ModuleList([_tower_lstm(config) for _ in range(config.num_towers)])
            # [left; right] context of one tower -> its width, one Linear per tower
            self.context_proj = nn.ModuleList(
                [nn.Linear(2 * config.hidden_size, config.hidden_size) for _ in range(config.num_towers)]
            )

    def forward(self, hidden_states: torch.Tensor, output_hidden_states: bool = False, **attention_inputs):
        # attention_inputs (mask, cache, positions) do not apply to LSTMs
        outputs = []
        for tower_idx, forward_lstm in enumerate(self.forward_lstms):
            tower_inputs = hidden_states[tower_idx]  # [batch, seq, hidden]
            left_to_right, _ = forward_lstm(tower_inputs)
            if not self.bidirectional:
                outputs.append(left_to_right)
                continue
            right_to_left, _ = self.backward_lstms[tower_idx](tower_inputs.flip(1))
            right_to_left = right_to_left.flip(1)
            left_context = F.pad(left_to_right[:, :-1], (0, 0, 1, 0))  # state after t - 1; zeros at t = 0
            right_context = F.pad(right_to_left[:, 1:], (0, 0, 0, 1))  # state after t + 1; zeros at the end
            outputs.append(self.context_proj[tower_idx](torch.cat([left_context, right_context], dim=-1)))
        return _stack_output(torch.stack(outputs), output_hidden_states)  # [towers, batch, seq, hidden]


def _unprojected_lstm(config: TwoTowerConfig) -> nn.LSTM:
    # the reference's nn.LSTM(model width, cells, num_layers): no projection inside, no dropout between layers
    return nn.LSTM(config.hidden_size // 2, config.lstm_hidden_size, config.num_hidden_layers, batch_first=True)


def _direction_linears(config: TwoTowerConfig, in_features: int) -> nn.ModuleList:
    return nn.ModuleList([nn.Linear(in_features, config.hidden_size // 2) for _ in range(config.num_towers)])


class TwoTowerELMoTowers(nn.Module):
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

    no_split_module = "TwoTowerELMoTowers"

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.forward_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.backward_norm = nn.LayerNorm(config.embedding_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout)
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
        return _stack_output(torch.stack(outputs), output_hidden_states)  # [towers, batch, seq, hidden]


__all__ = ["TwoTowerELMoTowers", "TwoTowerLSTMTowers"]
