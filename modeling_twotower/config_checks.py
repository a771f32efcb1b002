"""
What a two-tower config may hold: the choices of its fields and the checks that refuse anything else, each with one
error that names the value and the fix. `check_fields` looks at each field alone, before the config derives the
defaults that read other fields; `check_combinations` at the fields together, after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers.activations import ACT2FN

from .towers import TOWER_KINDS

if TYPE_CHECKING:  # the config imports these checks, so it is named in annotations only
    from .configuration_twotower import TwoTowerConfig

LAYOUTS = ("bert", "gpt", "elmo")
INITIALIZATIONS = ("normal", "reference")
TOWER_TYPES = tuple(TOWER_KINDS)  # the registered tower kinds (towers.py)
PROBE_TYPES = ("mlp", "linear")
POSITIVE_FIELDS = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "max_position_embeddings",
)  # fmt: skip


def _is_positive_int(value) -> bool:
    return isinstance(value, int) and value > 0


def check_fields(config: TwoTowerConfig):
    """Each field of `config` alone: its type, range or choices."""
    for field in POSITIVE_FIELDS:
        if not _is_positive_int(getattr(config, field)):
            raise ValueError(f"`{field}` must be a positive integer, got {getattr(config, field)!r}.")
    if not isinstance(config.num_towers, int) or config.num_towers < 2:
        raise ValueError(
            f"`num_towers` must be an integer >= 2 (a two-tower model needs at least two towers), "
            f"got {config.num_towers!r}."
        )
    if config.layout not in LAYOUTS:
        raise ValueError(
            f"Unknown `layout` {config.layout!r}; use one of {list(LAYOUTS)} (a config written by a newer version "
            f"of twotower needs that version)."
        )
    if config.tower_type is not None and config.tower_type not in TOWER_KINDS:
        raise ValueError(f"Unknown `tower_type` {config.tower_type!r}; use one of {list(TOWER_KINDS)}.")
    if config.embedding_size is not None and not _is_positive_int(config.embedding_size):
        rule, width = config.layout_embedding_size()
        raise ValueError(
            f"`embedding_size` must be a positive integer (or None for {rule} = {width}), "
            f"got {config.embedding_size!r}."
        )
    if config.lstm_hidden_size is not None and not _is_positive_int(config.lstm_hidden_size):
        raise ValueError(f"`lstm_hidden_size` must be a positive integer, got {config.lstm_hidden_size!r}.")
    if config.initialization not in INITIALIZATIONS:
        raise ValueError(f"Unknown `initialization` {config.initialization!r}; use one of {list(INITIALIZATIONS)}.")
    if not isinstance(config.probe_replicas, int) or config.probe_replicas < 1:
        raise ValueError(
            f"`probe_replicas` must be a positive integer (probes per tower), got {config.probe_replicas!r}."
        )
    if config.probe_type not in PROBE_TYPES:
        raise ValueError(f"Unknown `probe_type` {config.probe_type!r}; use one of {list(PROBE_TYPES)}.")
    if config.hidden_act not in ACT2FN:
        raise ValueError(f"Unknown `hidden_act` {config.hidden_act!r}; use one of {sorted(ACT2FN)}.")
    for field in ("hidden_dropout", "attention_dropout"):
        if not 0.0 <= getattr(config, field) < 1.0:
            raise ValueError(f"`{field}` must be in [0, 1), got {getattr(config, field)!r}.")


def check_combinations(config: TwoTowerConfig):
    """The fields of `config` together: its layout, its tower kind and the sizes and options they allow."""
    _check_layout(config)
    kind = TOWER_KINDS[config.tower_type]
    if kind.has_attention and config.hidden_size % config.num_attention_heads != 0:
        raise ValueError(
            f"`hidden_size` ({config.hidden_size}) must be divisible by `num_attention_heads` "
            f"({config.num_attention_heads}); change one of them, e.g. hidden_size="
            f"{config.num_attention_heads * max(1, round(config.hidden_size / config.num_attention_heads))}."
        )
    if "lstm_hidden_size" not in kind.size_fields and config.lstm_hidden_size is not None:
        kinds = " or ".join(f"tower_type={name!r}" for name, other in TOWER_KINDS.items()
                            if "lstm_hidden_size" in other.size_fields)  # fmt: skip
        sizes = ", ".join(f"`{field}`" for field in ("hidden_size", *kind.size_fields))
        raise ValueError(
            f"`lstm_hidden_size`={config.lstm_hidden_size} only applies to {kinds}; drop it ({config.tower_type} "
            f"towers are sized by {sizes})."
        )
    if config.layout == "bert" and config.lstm_hidden_size is not None and config.lstm_hidden_size < config.hidden_size:
        raise ValueError(
            f"`lstm_hidden_size` ({config.lstm_hidden_size}) is smaller than `hidden_size` ({config.hidden_size}): "
            f"LSTM cells are projected down to the tower width, never up; use lstm_hidden_size >= "
            f"{config.hidden_size} (equal: no projection)."
        )
    if config.tower_heads and not config.cooperative:
        raise ValueError(
            "`tower_heads` gives a cooperative model's towers heads of their own; the independent-towers control "
            "(cooperative=False) has them already: drop tower_heads."
        )
    if not config.joint_gradient and not config.tower_heads:
        raise ValueError(
            "joint_gradient=False stops the joint loss at the towers, which would then learn nothing: set "
            "tower_heads=True so that each tower trains on a loss of its own."
        )


def _check_layout(config: TwoTowerConfig):
    kind = TOWER_KINDS[config.tower_type]
    if config.layout not in kind.layouts:
        layout_kinds = [name for name, other in TOWER_KINDS.items() if config.layout in other.layouts]
        raise ValueError(
            f"layout={config.layout!r} has {' or '.join(layout_kinds)} towers, not tower_type={config.tower_type!r}; "
            f"drop `tower_type`, or use a layout of {config.tower_type} towers: {list(kind.layouts)}."
        )
    if config.layout == "elmo" and config.hidden_size % 2 != 0:
        raise ValueError(
            f"layout='elmo': `hidden_size` ({config.hidden_size}) is one tower's width, a forward and a backward "
            f"LM of hidden_size // 2 each; use an even hidden_size, e.g. {config.hidden_size + 1}."
        )
    stack = kind.stack_class(config.layout)
    if config.bidirectional is not None and config.bidirectional not in stack.directions:
        raise ValueError(
            f"layout={config.layout!r} has {stack.card_names[stack.directions[0]]} towers only, not "
            f"bidirectional={config.bidirectional}: use "
            f"{'TwoTowerForCausalLM' if config.bidirectional else 'TwoTowerForMaskedLM'}, or for "
            f"{'bidirectional' if config.bidirectional else 'causal'} {config.tower_type} towers a layout of "
            f"{[layout for layout in kind.layouts if config.bidirectional in kind.stack_class(layout).directions]}."
        )
    if config.separate_embeddings and (config.layout != "bert" or config.embedding_size % config.num_towers):
        raise ValueError(
            f"`separate_embeddings` gives each tower an equal slice of the bert layout's embedding; layout="
            f"{config.layout!r} with embedding_size={config.embedding_size} and num_towers={config.num_towers} has "
            "none: use layout='bert' and an embedding_size divisible by num_towers."
        )
    if config.layout == "gpt" and config.embedding_size != config.hidden_size:
        raise ValueError(
            f"layout='gpt' feeds the shared embedding to every tower unprojected, so `embedding_size` must equal "
            f"hidden_size ({config.hidden_size}), got {config.embedding_size}; drop it, or use layout='bert' for a "
            f"projected embedding."
        )
