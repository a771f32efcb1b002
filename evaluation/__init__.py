"""Measuring tower preference: the statistics core, the scoring pipeline and its report."""

from .tower_preference.preference_stats import (
    PreferenceAccumulator,
    PreferenceResult,
    compare_preferences,
    compute_preference,
    sarle_bimodality_coefficient,
)


__all__ = [
    "PreferenceAccumulator",
    "PreferenceResult",
    "compare_preferences",
    "compute_preference",
    "sarle_bimodality_coefficient",
]
