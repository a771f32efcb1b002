"""The two-tower language model as a Transformers model: config, model classes and Auto registration."""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

from .checkpoint_checks import TwoTowerCheckpointError
from .configuration_twotower import PRESETS, TwoTowerConfig
from .modeling_twotower import (
    TwoTowerForCausalLM,
    TwoTowerForMaskedLM,
    TwoTowerModel,
    TwoTowerPreTrainedModel,
    TwoTowerProbes,
)

# pip route: the Auto classes resolve the two-tower classes once this package is imported (safe to repeat).
AutoConfig.register(TwoTowerConfig.model_type, TwoTowerConfig, exist_ok=True)
AutoModel.register(TwoTowerConfig, TwoTowerModel, exist_ok=True)
AutoModelForCausalLM.register(TwoTowerConfig, TwoTowerForCausalLM, exist_ok=True)
AutoModelForMaskedLM.register(TwoTowerConfig, TwoTowerForMaskedLM, exist_ok=True)

# Hub route: every save_pretrained writes `auto_map` and copies these modeling files (trust_remote_code=True).
TwoTowerConfig.register_for_auto_class()
TwoTowerModel.register_for_auto_class("AutoModel")
TwoTowerForCausalLM.register_for_auto_class("AutoModelForCausalLM")
TwoTowerForMaskedLM.register_for_auto_class("AutoModelForMaskedLM")

__all__ = [
    "PRESETS",
    "TwoTowerCheckpointError",
    "TwoTowerConfig",
    "TwoTowerModel",
    "TwoTowerForCausalLM",
    "TwoTowerForMaskedLM",
    "TwoTowerPreTrainedModel",
    "TwoTowerProbes",
]
