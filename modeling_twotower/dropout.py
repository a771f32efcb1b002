"""Dropout that torch.compile draws on the CPU as eager code does, and fuses around."""

import torch
from torch import nn


class Dropout(nn.Dropout):
    """
    `nn.Dropout`, bitwise: the same masks and values from the same seed, eager or compiled. On the CPU it computes
    what ATen's CPU dropout computes, written out: a noise tensor drawn by `bernoulli_`, scaled, times the input.
    Traced by torch.compile, `F.dropout` becomes `native_dropout`, one opaque call whose input and output inductor
    must write out, which cost a compiled training step's forward more than compiling saved; written out, the draw
    is ATen's bulk `bernoulli_` into a tensor the data does not flow through, and inductor fuses the product into
    its neighbours (docs/speed.md). Accelerators keep `F.dropout`, one fused kernel there.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if not (self.training and 0 < self.p < 1 and hidden_states.device.type == "cpu") or self.inplace:
            return super().forward(hidden_states)
        keep = 1 - self.p
        return hidden_states * torch.empty_like(hidden_states).bernoulli_(keep).div_(keep)


__all__ = ["Dropout"]
