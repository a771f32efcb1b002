"""
Checks of a dataclass of options (every field its annotated type, every bounded one in its range) and the command
line's conversion of values, shared by the training and scoring commands: a bad value or an unknown option is one
error naming it (with the closest known name), never argparse's usage-and-exit.
"""

import argparse
import dataclasses
import difflib
import math
import types
import typing

from transformers import HfArgumentParser
from transformers.hf_argparser import string_to_bool

from .errors import TwoTowerUserError

TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "text", type(None): "unset (null)"}


def check_types(options) -> None:
    """
    Every field of a dataclass of options holds its annotated type, as the command line's conversion guarantees: a
    Python caller's "5" or "1e-3" is refused like a recipe's, a bool is no int, an int is a float; floats are finite.
    """
    hints = typing.get_type_hints(type(options))
    for field in dataclasses.fields(options):
        allowed = _plain_types(hints[field.name])
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


def _plain_types(annotation) -> tuple | None:
    """The types an `int | None`-style annotation allows; None for anything else (lists, dicts: checked elsewhere)."""
    is_union = isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union
    allowed = typing.get_args(annotation) if is_union else (annotation,)
    return allowed if all(kind in (bool, int, float, str, type(None)) for kind in allowed) else None


def check_ranges(options, ranges: dict, unset_means: dict) -> None:
    """Each bounded option against its range (`ranges`: name -> (test, requirement in words)); None is unset."""
    for name, (test, requirement) in ranges.items():
        value = getattr(options, name, None)
        if value is None or test(value):
            continue
        unset = f", or leave it unset to {unset_means[name]}" if name in unset_means else ""
        raise TwoTowerUserError(f"`{name}` must be {requirement}, got {value!r}{unset}.")


def closest_name(name: str, known) -> str:
    """' (did you mean `x`?)' for a misspelt option name, or nothing."""
    matches = difflib.get_close_matches(name.lstrip("-").split("=")[0], list(known), n=1)
    return f" (did you mean `{matches[0]}`?)" if matches else ""


def convert_recipe_values(parser: HfArgumentParser, values: dict, recipe: str) -> dict:
    """
    A recipe's values converted exactly as the command line converts them (the type each option has in `parser`):
    YAML reads `1e-3` as a string and keeps a quoted "5" a string, so both paths go through one conversion.
    """
    converted = {}
    for name, value in values.items():
        action = parser._option_string_actions[f"--{name}"]
        if value is None or action.type is None:
            converted[name] = value
            continue
        if isinstance(value, bool) and action.type is str:
            raise TwoTowerUserError(
                f"Recipe {recipe} sets `{name}: {value}`: YAML reads an unquoted yes/no/on/off/true/false as a "
                f"boolean; quote the text you meant (e.g. `{name}: \"no\"`)."
            )
        try:
            if isinstance(value, list) and action.nargs in ("+", "*"):
                converted[name] = [action.type(str(item)) for item in value]
            else:
                converted[name] = action.type(str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError) as error:
            kind = TYPE_NAMES[bool] if action.type is string_to_bool else TYPE_NAMES.get(action.type, "valid")
            raise TwoTowerUserError(
                f"Recipe {recipe} sets `{name}: {value!r}`, which is not {kind}; fix the value."
            ) from error
    return converted


def parse_command_line(parser: HfArgumentParser, args: list[str]) -> list:
    """parse_args_into_dataclasses, refusing a bad value or an unknown option (named, with the closest known one)."""

    def refuse(message):  # argparse would print its usage and exit
        raise TwoTowerUserError(f"{message} (`--help` lists the options)")

    parser.error = refuse
    *parsed, remaining = parser.parse_args_into_dataclasses(
        args=args, return_remaining_strings=True, look_for_args_file=False
    )
    if remaining:
        known = [option.lstrip("-") for action in parser._actions for option in action.option_strings]
        raise TwoTowerUserError(f"unknown options {remaining}{closest_name(remaining[0], known)}; `--help` lists them all.")
    return parsed


__all__ = ["TYPE_NAMES", "check_ranges", "check_types", "closest_name", "convert_recipe_values", "parse_command_line"]
