"""
How the base model joins the towers' final hidden states [towers, batch, seq, hidden] into the features the LM head
and the probes read, [batch, seq, towers * hidden]: chosen once by `tower_fusion` (cooperative or the control).
"""

from torch import nn

from .batched_layers import TwoTowerBatchedLayerNorm, concat_towers
from .configuration_twotower import TwoTowerConfig
from .dropout import Dropout


def _fused_dropout(config: TwoTowerConfig) -> nn.Module:
    # the reference's ELMo drops out the fused features too
    return Dropout(config.hidden_dropout) if config.layout == "elmo" else nn.Identity()


class TwoTowerFusion(nn.Module):
    """The paper's join: one LayerNorm over the towers' concatenation."""

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.fused_hidden_size, eps=config.layer_norm_eps)
        self.dropout = _fused_dropout(config)

    def forward(self, tower_hidden_states):
        return self.dropout(self.norm(concat_towers(tower_hidden_states)))


class TwoTowerIndependentFusion(nn.Module):
    """The control's: each tower's own LayerNorm, then the concatenation: no normalization statistic is shared."""

    def __init__(self, config: TwoTowerConfig):
        super().__init__()
        self.norm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        self.dropout = _fused_dropout(config)

    def forward(self, tower_hidden_states):
        return self.dropout(concat_towers(self.norm(tower_hidden_states)))


def tower_fusion(config: TwoTowerConfig) -> nn.Module:
    return TwoTowerFusion(config) if config.cooperative else TwoTowerIndependentFusion(config)


__all__ = ["TwoTowerFusion", "TwoTowerIndependentFusion", "tower_fusion"]
