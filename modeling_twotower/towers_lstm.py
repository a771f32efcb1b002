"""
This package's LSTM towers in the bert layout (`tower_type="lstm"`): each tower's multi-layer LSTM, forward only
(causal) or with a backward one (ELMo-style, the masked family). The kind's other layout, the reference's ELMo, has
a stack of its own (`towers_elmo.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from .reference_initialization import torch_default_lstm_
from .tower_stack import TowerStack, stack_output
from .towers_elmo import TwoTowerELMoTowers

if TYPE_CHECKING:  # the config reads the kinds (its choices), so a kind names the config in annotations only
    from .configuration_twotower import TwoTowerConfig


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


class TwoTowerLSTMTowers(TowerStack):
    """
    The bert layout's LSTM towers: each tower's multi-layer LSTM; hidden states [towers, batch, seq, hidden] in and out.

    Causal (`bidirectional=False`): position t is the forward LSTM's state after token t (it predicts t + 1).
    Bidirectional (ELMo-style): each tower also runs a backward LSTM, and position t combines the forward
    state at t - 1 with the backward state at t + 1, so the prediction for token t never reads token t.

    cuDNN/oneDNN LSTM kernels take one sequence batch per call, so the towers run one after the other here;
    this is the only place in the model where towers are a Python loop.
    """

    tower_type = "lstm"
    layouts = ("bert", "elmo")
    size_fields = ("lstm_hidden_size",)
    kind_name = "LSTM"
    no_split_module = "TwoTowerLSTMTowers"  # what device maps and FSDP keep whole
    reference_initializers = {nn.LSTM: torch_default_lstm_}
    card_names = {False: "forward LSTM", True: "forward + backward LSTM (ELMo-style)"}
    card_size_rows = (("LSTM cell size (`lstm_hidden_size`), projected back to the tower width", "lstm_hidden_size"),)
    card_limitations = TwoTowerELMoTowers.card_limitations  # its bidirectional towers are ELMo-style too
    card_tags = ("lstm",)

    @classmethod
    def stack_class(cls, layout: str) -> type[TowerStack]:
        return TwoTowerELMoTowers if layout == "elmo" else cls

    @classmethod
    def card_architecture(cls, config: TwoTowerConfig, bidirectional: bool) -> str:
        if bidirectional:
            return (
                "a forward and a backward multi-layer LSTM, and position t reads the forward stack at t - 1 and the "
                "backward stack at t + 1, never token t itself"
            )
        return "a multi-layer forward LSTM"

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
        return stack_output(torch.stack(outputs), output_hidden_states)  # [towers, batch, seq, hidden]


__all__ = ["TwoTowerLSTMTowers"]
