"""
The tower kinds, one module each (`towers_*.py`): `TOWER_KINDS` is the one list of them, from which the config takes
its `tower_type` choices and the conformance suite (tests/modeling/test_kind_conformance.py) its parameters. Each
kind is a `TowerStack` (`tower_stack.py`) that declares its facts: the layouts and directions it builds, cache,
attention, whether it reads the token it predicts, packed rows, FLOPs, its size fields, its reference
initialisation, its model-card words, its FSDP unit.

Flat modules, not a `towers/` subpackage: this folder is also the Hub custom code that `save_pretrained` copies,
and transformers copies and loads only the files of this folder named by `from .module import ...`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .batched_layers import TowerStackOutput
from .tower_stack import TowerStack
from .towers_lstm import TwoTowerLSTMTowers
from .towers_ssm import TwoTowerSSMTowers
from .towers_transformer import TwoTowerTransformerTowers

if TYPE_CHECKING:  # the config imports this registry (its choices), so it is named in annotations only
    from .configuration_twotower import TwoTowerConfig

# by `tower_type`, in the order of the config's choices: the first kind with a layout is that layout's default
TOWER_KINDS = {kind.tower_type: kind for kind in (TwoTowerTransformerTowers, TwoTowerLSTMTowers, TwoTowerSSMTowers)}


def tower_stack_class(config: TwoTowerConfig) -> type[TowerStack]:
    """The stack class of the config's tower type and layout: its facts, without building it."""
    return TOWER_KINDS[config.tower_type].stack_class(config.layout)


def tower_stack(config: TwoTowerConfig, bidirectional: bool) -> TowerStack:
    """The towers' stack of the config's tower type and layout."""
    return tower_stack_class(config)(config, bidirectional)


__all__ = ["TOWER_KINDS", "TowerStack", "TowerStackOutput", "tower_stack", "tower_stack_class"]
