"""How the report and the study write numbers: one number formatter, one interval formatter, one Markdown table."""

import math

import pandas as pd


def number(value, digits=3) -> str:
    """`value` with `digits` decimals; "n/a" for a missing figure (None or NaN)."""
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def percent(share) -> str:
    """A share as a percentage with one decimal; "n/a" for a missing one."""
    return "n/a" if share is None or math.isnan(share) else f"{100 * share:.1f}%"


def with_interval(value, ci, digits=3, over_types=False) -> str:
    """`value [low, high]`; "n/a" without a value, "(1 seed)" without an interval (one seed gives none), and
    "(1 seed, over types)" for a one-seed figure whose interval comes from resampling token types."""
    if value is None:
        return "n/a"
    if ci is None:
        return f"{number(value, digits)} (1 seed)"
    text = f"{number(value, digits)} [{number(ci[0], digits)}, {number(ci[1], digits)}]"
    return text + " (1 seed, over types)" if over_types else text


def markdown_table(frame: pd.DataFrame, tablefmt="pipe") -> str:
    """A DataFrame of formatted cells as a Markdown table; cells stay as written (no parsing into numbers)."""
    return frame.to_markdown(index=False, disable_numparse=True, tablefmt=tablefmt)
