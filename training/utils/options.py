"""
Options as dataclass fields read by transformers' HfArgumentParser, shared by the training and scoring commands.

A field is declared with `option(default, help, bounds=..., choices=..., unset=...)`: its help for `--help`, and in
its metadata the range and choices it is checked against (`check_options`, once, whichever way the value came: the
command line, a recipe or Python). A recipe (YAML) is converted with the command line's conversion and applied as the
parser's defaults, under the command line. A bad value or an unknown option is one error naming it (with the closest
known name), never argparse's usage-and-exit.
"""

import argparse
import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from .cli import command_name
from .errors import TwoTowerUserError

TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "text", type(None): "unset (null)"}


@dataclass(frozen=True)
class Bounds:
    """The range of a number: `low` and `high` (None: unbounded), each included unless `*_open`; `note` says why."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def __contains__(self, value) -> bool:
        above = self.low is None or (value > self.low if self.low_open else value >= self.low)
        below = self.high is None or (value < self.high if self.high_open else value <= self.high)
        return above and below

    def __str__(self) -> str:
        low, high = (f"{bound:g}" if isinstance(bound, float) else str(bound) for bound in (self.low, self.high))
        if self.high is None:
            text = f"{'>' if self.low_open else '>='} {low}"
        else:
            text = f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"
        return f"{text} ({self.note})" if self.note else text


def at_least(low: float, note: str = "") -> Bounds:
    return Bounds(low, note=note)


def above(low: float, note: str = "") -> Bounds:
    return Bounds(low, low_open=True, note=note)


class OptionMetadata(Mapping):
    """
    A field's metadata: `help`, which HfArgumentParser hands to argparse (it passes every key the mapping lists),
    and, by key, `bounds`, `choices` and `unset` (what None does), which only `check_options` reads.
    """

    def __init__(self, help: str, bounds: Bounds | None, choices: tuple | None, unset: str | None):
        self.values = {"help": help, "bounds": bounds, "choices": choices, "unset": unset}

    def __getitem__(self, key):
        return self.values[key]

    def __iter__(self):
        return iter(("help",))

    def __len__(self) -> int:
        return 1


def option(default=dataclasses.MISSING, help: str = "", *, bounds: Bounds | None = None, choices=None,
           unset: str | None = None) -> dataclasses.Field:
    """A dataclass field of options: its default, help (with its choices, range and unset meaning) and checks."""
    details = [f"one of {' | '.join(str(choice) for choice in choices if choice is not None)}"] if choices else []
    details += [f"must be {bounds}"] if bounds is not None else []
    details += [f"unset: {unset}"] if unset is not None else []
    text = (f"{help} [{'; '.join(details)}]" if details else help).replace("%", "%%")  # argparse formats help
    return dataclasses.field(default=default, metadata=OptionMetadata(text, bounds, choices and tuple(choices), unset))


def check_options(options) -> None:
    """Every field of a dataclass of options: its annotated type, then its choices and range (metadata)."""
    check_types_and_choices(options)
    check_ranges(options)


def check_types_and_choices(options) -> None:
    """Every field's type and choices: what a check across options may rely on."""
    check_types(options)
    for field in dataclasses.fields(options):
        value, choices = getattr(options, field.name), field.metadata.get("choices")
        if choices is not None and value not in choices:
            raise TwoTowerUserError(f"`{field.name}` is {value!r}; choose one of {list(choices)}.")


def check_ranges(options) -> None:
    """Every bounded field in its range (None, where the field allows it, is unset and not tested)."""
    for field in dataclasses.fields(options):
        value, metadata = getattr(options, field.name), field.metadata
        bounds = metadata.get("bounds")
        if bounds is not None and value is not None and value not in bounds:
            unset = f", or leave it unset to {metadata['unset']}" if metadata.get("unset") else ""
            raise TwoTowerUserError(f"`{field.name}` must be {bounds}, got {value!r}{unset}.")


def check_types(options) -> None:
    """
    Every field of a dataclass of options holds its annotated type, as the command line's conversion guarantees: a
    Python caller's "5" or "1e-3" is refused like a recipe's, a bool is no int, an int is a float; floats are finite.
    """
    hints = typing.get_type_hints(type(options))
    for field in dataclasses.fields(options):
        allowed = plain_types(hints[field.name])
        value = getattr(options, field.name)
        if allowed is None or (value is None and type(None) in allowed):
            continue
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (
            (bool in allowed and isinstance(value, bool))
            or (int in allowed and is_number and isinstance(value, int))
            or (float in allowed and is_number)
            or (str in allowed and isinstance(value, str))
        ):
            names = " or ".join(TYPE_NAMES[kind] for kind in allowed)
            raise TwoTowerUserError(f"`{field.name}` is {value!r} ({type(value).__name__}); it must be {names}.")
        if isinstance(value, float) and not math.isfinite(value):
            raise TwoTowerUserError(f"`{field.name}` is {value!r}; it must be a finite number.")


def plain_types(annotation) -> tuple | None:
    """The types an `int | None`-style annotation allows; None for anything else (lists, dicts: checked elsewhere)."""
    is_union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    allowed = typing.get_args(annotation) if is_union else (annotation,)
    return allowed if all(kind in (bool, int, float, str, type(None)) for kind in allowed) else None


def closest_name(name: str, known) -> str:
    """' (did you mean `x`?)' for a misspelt option name, or nothing."""
    matches = difflib.get_close_matches(name.lstrip("-").split("=")[0], list(known), n=1)
    return f" (did you mean `{matches[0]}`?)" if matches else ""


def option_names(*dataclass_types) -> list[str]:
    return [field.name for dtype in dataclass_types for field in dataclasses.fields(dtype)]


def convert_values(dataclass_type, values: dict, recipe: str) -> dict:
    """
    A recipe's values converted as the command line converts them (HfArgumentParser gives argparse each field's
    type, string_to_bool for a bool): YAML reads `1e-3` as a string and keeps a quoted "5" a string, so both paths
    go through one conversion.
    """
    hints = typing.get_type_hints(dataclass_type)
    converted = {}
    for name, value in values.items():
        allowed = [kind for kind in plain_types(hints[name]) or () if kind is not type(None)]
        kind = allowed[0] if len(allowed) == 1 else None
        if value is None or kind is None:
            converted[name] = value
            continue
        if isinstance(value, bool) and kind is str:
            raise TwoTowerUserError(
                f"Recipe {recipe} sets `{name}: {value}`: YAML reads an unquoted yes/no/on/off/true/false as a "
                f"boolean; quote the text you meant (e.g. `{name}: \"no\"`)."
            )
        try:
            converted[name] = (string_to_bool if kind is bool else kind)(str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
            raise TwoTowerUserError(
                f"Recipe {recipe} sets `{name}: {value!r}`, which is not {TYPE_NAMES[kind]}; fix the value."
            ) from error
    return converted


class OptionsParser(HfArgumentParser):
    """
    HfArgumentParser whose errors raise: a bad value (`exit_on_error=False`) and a missing required option (which
    argparse reports through `error`) are one TwoTowerUserError; unknown options are named with the closest one.
    """

    def __init__(self, *dataclass_types, **kwargs):
        super().__init__(dataclass_types, exit_on_error=False, **({"prog": command_name()} | kwargs))

    def error(self, message):
        raise TwoTowerUserError(f"{message} (`--help` lists the options)")

    def parse(self, args: list[str] | None, defaults: dict | None = None) -> list:
        """The dataclasses of `args` (None: the command line's) over `defaults` (e.g. a recipe's converted values)."""
        self.set_defaults(**(defaults or {}))
        try:
            *parsed, remaining = self.parse_args_into_dataclasses(
                args=args, return_remaining_strings=True, look_for_args_file=False
            )
        except argparse.ArgumentError as error:
            self.error(str(error))
        if remaining:
            known = option_names(*self.dataclass_types)
            raise TwoTowerUserError(
                f"unknown options {remaining}{closest_name(remaining[0], known)}; `--help` lists them all."
            )
        return parsed


__all__ = ["Bounds", "OptionsParser", "TYPE_NAMES", "above", "at_least", "check_options", "check_ranges",
           "check_types", "check_types_and_choices",
           "closest_name", "convert_values", "option", "option_names"]
