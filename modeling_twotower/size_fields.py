"""
Which config field sizes a mismatched weight: the field that, set back to the value the weights imply, makes the
model's shapes those saved. A size is never put down to a field only because the field has that value (a config
with `hidden_size` 64 and `max_position_embeddings` 128 sizes a [64, 2 x 64] tensor by `hidden_size`).
"""

import copy

import torch


def _shapes(model_class, config) -> dict[str, tuple[int, ...]]:
    with torch.device("meta"):  # the shapes without allocating or drawing a weight
        model = model_class(copy.deepcopy(config))
    return {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}


def _mismatches(model_class, config, saved: dict[str, tuple[int, ...]]) -> int | None:
    """How many of the `saved` shapes the model of `config` does not give; None when that config builds no model."""
    try:
        expected = _shapes(model_class, config)
    except Exception:  # noqa: BLE001 (a field set to a value its config or model refuses: not the answer)
        return None
    return sum(expected.get(name, shape) != shape for name, shape in saved.items())


def _implied_value(value, saved_size: int, expected_size: int) -> int | None:
    """The field's value that scales `expected_size` to `saved_size` (sizes are multiples of a field), if whole."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        return None
    implied, remainder = divmod(value * saved_size, expected_size)
    return implied if remainder == 0 and implied > 0 and implied != value else None


def field_that_sizes(model_class, config, fields, saved: dict[str, tuple[int, ...]], mismatch) -> tuple | None:
    """
    (field, its value at save) for `mismatch` = (tensor, saved shape, expected shape): of `fields`, the one whose
    value implied by the saved size fixes that tensor and leaves the fewest of the `saved` shapes mismatched; None
    when no single field does.
    """
    name, saved_shape, expected_shape = mismatch
    if len(saved_shape) != len(expected_shape):
        return None
    best = None
    for saved_size, expected_size in zip(saved_shape, expected_shape):
        if saved_size == expected_size:
            continue
        for field in fields:
            implied = _implied_value(getattr(config, field, None), saved_size, expected_size)
            if implied is None:
                continue
            candidate = copy.deepcopy(config)
            setattr(candidate, field, implied)
            if _mismatches(model_class, candidate, {name: saved_shape}) != 0:
                continue
            remaining = _mismatches(model_class, candidate, saved)
            if remaining is not None and (best is None or remaining < best[0]):
                best = (remaining, field, implied)
    return None if best is None else best[1:]
