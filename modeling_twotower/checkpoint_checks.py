"""
Checks of saved weights against the model they load into, read from the safetensors headers before any weight is:
a config.json that disagrees with its weights, or a damaged file, raises one error that names the folder, the file,
the config field and the fix (instead of transformers' size-mismatch report or a SafetensorError that names no
file). The check is by structure as well as by size: a module the config's model has and the weights lack, or one
the weights hold and that model has not (a config relabelled to another tower kind), is refused, naming the kind,
instead of loading with those modules drawn at random. Weights that load as NaN or infinity are named in a warning.
"""

import copy
import json
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, logging

from .configuration_twotower import LAYOUTS, PROBE_TYPES, TOWER_TYPES
from .size_fields import field_that_sizes
from .towers import TOWER_KINDS

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
NAMED_MODULES = 3  # modules named in a structure error; the rest are counted
# The config fields that decide which modules a model has (beside the tower kind: layout and tower_type); weights of
# another structure are put down to the one whose other value gives the model the weights' modules.
STRUCTURE_FLAGS = ("cooperative", "tower_heads", "separate_embeddings")


class TwoTowerCheckpointError(ValueError):
    """Saved weights that cannot load into the model their config describes: a damaged file, or other sizes."""


def damaged_file_message(path, error: Exception) -> str:
    return (
        f"{path} is not a readable safetensors file ({error}): it is damaged or cut short; copy or download it "
        "again, or save the model again."
    )


def loaded_weight_files(folder) -> list[Path]:
    """The safetensors files `from_pretrained` reads in a folder: the shards its index names, else model.safetensors
    (other safetensors files beside them are not the model's)."""
    folder = Path(folder)
    index = folder / SAFE_WEIGHTS_INDEX_NAME
    if not index.is_file():
        return [folder / SAFE_WEIGHTS_NAME] if (folder / SAFE_WEIGHTS_NAME).is_file() else []
    try:
        shards = set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise TwoTowerCheckpointError(
            f"{index} is not a readable weights index ({type(error).__name__}: {error}): it is damaged or cut "
            "short; copy or download it again, or save the model again."
        ) from error
    return sorted(folder / shard for shard in shards)


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


def _renamed(name: str, key_mapping: dict) -> str:
    for pattern, replacement in key_mapping.items():
        name = re.sub(pattern, replacement, name)
    return name


def _model_key(name: str, model_keys, key_mapping: dict, prefix: str) -> str:
    # the renaming from_pretrained does: the key mapping, then the base model's prefix dropped or added
    name = _renamed(name, key_mapping)
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


def _model_keys(model_class, config) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """({tensor name: shape} of `model_class(config)`, the tied names a checkpoint leaves out), built on the meta
    device: the model without allocating or drawing a weight."""
    with torch.device("meta"):
        model = model_class(copy.deepcopy(config))  # PreTrainedModel's constructor sets config fields
    shapes = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    return shapes, set(model.all_tied_weights_keys)


def _ancestors(name: str) -> list[str]:
    """The modules above a tensor name and the name itself, outermost first (`a.b.c` -> `a`, `a.b`, `a.b.c`)."""
    parts = name.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts) + 1)]


def _prefixes(names: set[str]) -> set[str]:
    """Every name of `names` and every module above it."""
    return {prefix for name in names for prefix in _ancestors(name)}


def _structure_difference(expected: set[str], saved: set[str], prefix: str) -> tuple[list[str], list[str]]:
    """
    (modules the model has and the weights lack, modules the weights hold and the model has not), each a module
    named once, or a tensor where only part of its module differs. An LM loaded from a base model's weights draws
    its heads, and a base model loaded from an LM's weights leaves them out, as transformers does: only the base
    model's part is compared then.
    """
    base = f"{prefix}."
    if any(name.startswith(base) for name in expected) and not any(name.startswith(base) for name in saved):
        expected = {name[len(base) :] for name in expected if name.startswith(base)}
    elif any(name.startswith(base) for name in saved) and not any(name.startswith(base) for name in expected):
        saved = {name[len(base) :] for name in saved if name.startswith(base)}

    def grouped(names: set[str], other: set[str]) -> list[str]:
        # each name the other side lacks, by the highest module of it that the other side has nothing of
        other_prefixes = _prefixes(other)
        return sorted({next(prefix for prefix in _ancestors(name) if prefix not in other_prefixes)
                       for name in names - other})  # fmt: skip

    return grouped(expected, saved), grouped(saved, expected)


def _structure_candidates(config):
    """Configs that differ from `config` in the tower kind (a layout and its towers) or in one STRUCTURE_FLAGS
    field or the probe type, each with the fields it changed; a combination the config refuses is skipped."""
    fields = config.to_dict()
    kinds = {(layout, tower_type) for layout in LAYOUTS for tower_type in TOWER_TYPES}
    changes = [{"layout": layout, "tower_type": tower_type} for layout, tower_type in sorted(kinds)]
    changes += [{flag: not fields[flag]} for flag in STRUCTURE_FLAGS]
    changes += [{"probe_type": probe_type} for probe_type in PROBE_TYPES]
    for change in changes:
        change = {field: value for field, value in change.items() if fields[field] != value}
        if not change:
            continue
        values = {**fields, **change}
        if "layout" in change:
            values["embedding_size"] = None  # the new layout's own width
        if "lstm_hidden_size" not in TOWER_KINDS[values["tower_type"]].size_fields:
            values["lstm_hidden_size"] = None
        try:
            yield type(config)(**values), change
        except ValueError:
            continue


def _kind(config) -> str:
    return f"`tower_type: {config.tower_type}` model (layout {config.layout})"


def _named(modules: list[str]) -> str:
    named = ", ".join(f"`{module}`" for module in modules[:NAMED_MODULES])
    return named + (f" (and {len(modules) - NAMED_MODULES} more)" if len(modules) > NAMED_MODULES else "")


def _structure_message(model_class, config, folder: Path, file_names: str, saved: set[str], difference) -> str:
    """The modules that differ, in words, and the field that gives the weights' structure, when one does."""
    missing, unexpected = difference
    prefix = model_class.base_model_prefix
    weights = f"the weights in {file_names}"
    if missing and unexpected:
        found = (f"its {_kind(config)} has {_named(missing)}, which {weights} lack, and they hold "
                 f"{_named(unexpected)}, which it has not")  # fmt: skip
    elif missing:
        found = f"its {_kind(config)} has {_named(missing)}, which {weights} lack"
    else:
        found = f"{weights} hold {_named(unexpected)}, which its {_kind(config)} has not"
    message = f"The config of {folder} does not describe its weights: {found}."
    for candidate, change in _structure_candidates(config):
        try:
            expected, tied = _model_keys(model_class, candidate)
        except ValueError:  # a config this model class refuses (the causal LM and the ELMo layout)
            continue
        if _structure_difference(set(expected) - tied, saved, prefix) == ([], []):
            settings = ", ".join(f"`{json.dumps(field)}: {json.dumps(value)}`" for field, value in change.items())
            kind = _kind(candidate) if {"layout", "tower_type"} & change.keys() else f"model with {settings}"
            return (
                f"{message} The weights are those of a {kind}: set {settings} in "
                f"{folder / 'config.json'} again (it was edited, or belongs to other weights), or load the config "
                "these weights were saved with."
            )
    return f"{message} Use the config.json these weights were saved with, or save the model again."


def check_weights_fit_config(model_class, config, weight_files, key_mapping: dict | None = None) -> None:
    """
    Raise TwoTowerCheckpointError when a file of `weight_files` is damaged, when `model_class(config)` has modules
    the files lack or lacks modules they hold (tied weights, which a checkpoint leaves out, and the heads of an LM
    loaded from a base model or left out of one, aside), or when a tensor saved in them has another shape than
    `model_class(config)` gives it; `key_mapping` renames saved keys as `from_pretrained` does.
    """
    if not weight_files:
        return
    key_mapping = key_mapping or {}
    expected, tied = _model_keys(model_class, config)
    prefix = model_class.base_model_prefix
    saved_shapes = read_weight_shapes(weight_files)
    folder = Path(weight_files[0]).parent
    saved = {_renamed(name, key_mapping) for name in saved_shapes}
    difference = _structure_difference(set(expected) - tied, saved, prefix)
    if difference != ([], []):
        file_names = " and ".join(sorted({path.name for _, path in saved_shapes.values()}))
        raise TwoTowerCheckpointError(_structure_message(model_class, config, folder, file_names, saved, difference))
    mismatched = []
    for name, (shape, path) in saved_shapes.items():
        key = _model_key(name, expected, key_mapping, prefix)
        if key in expected and expected[key] != shape:
            mismatched.append((key, shape, expected[key], path))
    if mismatched:
        raise TwoTowerCheckpointError(_mismatch_message(model_class, config, folder, mismatched))


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
