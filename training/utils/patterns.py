"""Regular expressions given on the command line, checked when the options are parsed: a bad one is one clear error
naming the option, instead of `re.error` when the pattern is first used."""

import re

from .errors import TwoTowerUserError


def check_regular_expression(option: str, pattern: str | None, example: str) -> None:
    """Raise TwoTowerUserError when `pattern` (the value of `option`; None: unset) does not compile."""
    if pattern is None:
        return
    try:
        re.compile(pattern)
    except re.error as error:
        raise TwoTowerUserError(
            f"{option} {pattern!r} is not a regular expression ({error}); escape special characters with a "
            f"backslash, or quote a literal name with ^...$, e.g. {option} {example!r}."
        ) from error
