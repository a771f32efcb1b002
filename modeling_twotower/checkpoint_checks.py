"""
Checks of saved weights against the model they load into, read from the safetensors headers before any weight is:
a config.json that disagrees with its weights, or a damaged file, raises one error that names the folder, the file,
the config field and the fix (instead of transformers' size-mismatch report or a SafetensorError that names no
file). Weights that load as NaN or infinity are named in a warning.
"""

import copy
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers.utils import logging

from .size_fields import field_that_sizes
logger = logging.get_logger(__name__)

# The config fields that size a dimension of some weight; a differing size is put down to the one that, set to the
# value the weights imply, makes the model's shapes those saved (size_fields.field_that_sizes).
SIZE_FIELDS = (
    "num_towers",
    "vocab_size",
    "embedding_size",
    "hidden_size",
    "intermediate_size",
    "lstm_hidden_size",
    "max_position_embeddings",
)
NAMED_TENSORS = 5  # non-finite tensors named in the warning; the rest are counted


class TwoTowerCheckpointError(ValueError):
    """Saved weights that cannot load into the model their config describes: a damaged file, or other sizes."""


def damaged_file_message(path, error: Exception) -> str:
    return (
        f"{path} is not a readable safetensors file ({error}): it is damaged or cut short; copy or download it "
        "again, or save the model again."
    )


def read_weight_shapes(weight_files) -> dict[str, tuple[tuple[int, ...], Path]]:
    """{tensor name: (shape, file)} from the files' headers; a file whose header does not cover it is named."""
    shapes = {}
    for path in weight_files:
        try:
            with safe_open(path, framework="pt") as weights:
                for name in weights.keys():
                    shapes[name] = (tuple(weights.get_slice(name).get_shape()), Path(path))
        except SafetensorError as error:
            raise TwoTowerCheckpointError(damaged_file_message(path, error)) from error
    return shapes


def _expected_shapes(model_class, config) -> dict[str, tuple[int, ...]]:
    # on the meta device: the shapes without allocating or drawing a weight
    with torch.device("meta"):
        model = model_class(copy.deepcopy(config))  # PreTrainedModel's constructor sets config fields
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _model_key(name: str, model_keys, key_mapping: dict, prefix: str) -> str:
    # the renaming from_pretrained does: the key mapping, then the base model's prefix dropped or added
    for pattern, replacement in key_mapping.items():
        name = re.sub(pattern, replacement, name)
    if name in model_keys:
        return name
    if name.startswith(f"{prefix}.") and name[len(prefix) + 1 :] in model_keys:
        return name[len(prefix) + 1 :]
    return f"{prefix}.{name}"


def _mismatch_message(model_class, config, folder: Path, mismatched) -> str:
    """The first mismatch that a config field explains (else the first one), in words, with the fix."""
    saved_shapes = {name: saved for name, saved, _, _ in mismatched}
    for name, saved, expected, path in mismatched:
        sized_by = field_that_sizes(model_class, config, SIZE_FIELDS, saved_shapes, (name, saved, expected))
        if sized_by is not None:
            field, saved_value = sized_by
            return (
                f"The config of {folder} sets `{field}` to {getattr(config, field)}, but its weights were saved with "
                f"{saved_value}: `{name}` is {list(saved)} in {path.name}, the config gives {list(expected)}. "
                f"Set `\"{field}\": {saved_value}` in {folder / 'config.json'} again (it was edited, or belongs to "
                "other weights), or load the config these weights were saved with."
            )
    name, saved, expected, path = mismatched[0]
    more = f" (and {len(mismatched) - 1} more tensors)" if len(mismatched) > 1 else ""
    return (
        f"The config of {folder} does not describe its weights: `{name}` is {list(saved)} in {path.name}, the config "
        f"gives {list(expected)}{more}. Use the config.json these weights were saved with, or save the model again."
    )


def check_weights_fit_config(model_class, config, weight_files, key_mapping: dict | None = None) -> None:
    """
    Raise TwoTowerCheckpointError when a file of `weight_files` is damaged, or when a tensor saved in them has
    another shape than `model_class(config)` gives it; `key_mapping` renames saved keys as `from_pretrained` does.
    Tensors only one side has are transformers' to report
    (missing weights are initialized, unexpected ones skipped).
    """
    if not weight_files:
        return
    key_mapping = key_mapping or {}
    expected = _expected_shapes(model_class, config)
    prefix = model_class.base_model_prefix
    mismatched = []
    for name, (saved, path) in read_weight_shapes(weight_files).items():
        key = _model_key(name, expected, key_mapping, prefix)
        if key in expected and expected[key] != saved:
            mismatched.append((key, saved, expected[key], path))
    if mismatched:
        raise TwoTowerCheckpointError(_mismatch_message(model_class, config, Path(weight_files[0]).parent, mismatched))


def warn_non_finite_weights(model, source) -> None:
    """A warning naming the tensors of a loaded model that hold NaN or infinity: its outputs would be NaN."""
    non_finite = [
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and tensor.device.type != "meta" and not bool(tensor.isfinite().all())
    ]
    if not non_finite:
        return
    named = ", ".join(f"`{name}`" for name in non_finite[:NAMED_TENSORS])
    more = f" and {len(non_finite) - NAMED_TENSORS} more" if len(non_finite) > NAMED_TENSORS else ""
    logger.warning(
        f"The weights loaded from {source} hold values that are not finite (NaN or infinity) in {named}{more}, so "
        f"the model's outputs will be NaN: the training run that saved them diverged, the file is damaged, or the "
        f"weights overflow {model.dtype}. Load an earlier checkpoint (or in float32), or train again."
    )


__all__ = ["TwoTowerCheckpointError", "check_weights_fit_config", "read_weight_shapes", "warn_non_finite_weights"]
