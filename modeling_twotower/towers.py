"""
The tower kinds, one module each (`towers_*.py`), and the choice of
the config's (`tower_stack`). Each kind is a `TowerStack` (`tower_stack.py`) that states its facts: cache,
attention, whether it reads the token it predicts, packed rows, FLOPs, its model-card name, its FSDP unit.

Flat modules, not a `towers/` subpackage: this folder is also the Hub custom code that `save_pretrained` copies,
and transformers copies and loads only the files of this folder named by `from .module import ...`.
"""

from torch import nn

from .batched_layers import TowerStackOutput
from .configuration_twotower import TwoTowerConfig
from .tower_stack import TowerStack
from .towers_elmo import TwoTowerELMoTowers
from .towers_lstm import TwoTowerLSTMTowers
from .towers_ssm import TwoTowerSSMTowers
from .towers_transformer import TwoTowerTransformerTowers

TOWER_KINDS = {kind.tower_type: kind for kind in (TwoTowerTransformerTowers, TwoTowerLSTMTowers, TwoTowerSSMTowers)}


def tower_stack_class(config: TwoTowerConfig) -> type[TowerStack]:
    """The stack class of the config's layout and tower type: its facts, without building it."""
    return TwoTowerELMoTowers if config.layout == "elmo" else TOWER_KINDS[config.tower_type]


def tower_stack(config: TwoTowerConfig, bidirectional: bool) -> nn.Module:
    """The towers' stack of the config's layout and tower type."""
    if config.layout == "elmo":
        return TwoTowerELMoTowers(config)
    return TOWER_KINDS[config.tower_type](config, bidirectional)


__all__ = ["TOWER_KINDS", "TowerStack", "TowerStackOutput", "tower_stack", "tower_stack_class"]
