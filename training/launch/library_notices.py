"""
Library notices that do not apply to a run, kept off its output.

- DeepSpeed, when installed, is imported by accelerate as it unwraps a model (to recognise a DeepSpeedEngine), and on a
  machine without a GPU logs "Setting accelerator to CPU" on import: a run that does not use DeepSpeed filters that
  one record from DeepSpeed's logger.
- accelerate's `save_state` removes a tied weight from a model's safetensors file with a warning ("Removed shared
  tensor"); transformers 5 stores a tied weight once, under its source, and loads it back the same way, so checkpoints
  leave the tied targets (the model's `all_tied_weights_keys`) out beforehand, silently.
"""

import logging

from accelerate.utils import DistributedType


DEEPSPEED_LOGGER = "DeepSpeed"
DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU"


def _not_deepspeed_cpu_notice(record: logging.LogRecord) -> bool:
    return DEEPSPEED_CPU_NOTICE not in record.getMessage()


def quiet_inapplicable_notices(accelerator) -> None:
    """Install both, once the accelerator knows whether the run uses DeepSpeed."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        logging.getLogger(DEEPSPEED_LOGGER).addFilter(_not_deepspeed_cpu_notice)
    accelerator.register_save_state_pre_hook(drop_tied_weights)


def drop_tied_weights(models, weights, output_dir) -> None:
    """accelerate save_state pre-hook: each model's tied weights left out of its state dict, where they share storage
    with their source (keys may carry a wrapper's prefix, e.g. DDP's `module.`)."""
    for model, state_dict in zip(models, weights):
        tied = getattr(getattr(model, "module", model), "all_tied_weights_keys", None) or {}
        for key in list(state_dict):
            for target, source in tied.items():
                if key == target or key.endswith("." + target):
                    source_key = key[: len(key) - len(target)] + source
                    if source_key in state_dict and state_dict[source_key].data_ptr() == state_dict[key].data_ptr():
                        del state_dict[key]
