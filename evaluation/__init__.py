"""Measuring tower preference: the statistics core, the scoring pipeline and its report."""

from .tower_preference.preference_stats import (
    PreferenceAccumulator,
    PreferenceResult,
    ReplicaPreferenceAccumulator,
    compare_preferences,
    compute_preference,
    fit_f_distribution,
    sarle_bimodality_coefficient,
)


__all__ = [
    "PreferenceAccumulator",
    "PreferenceResult",
    "ReplicaPreferenceAccumulator",
    "compare_preferences",
    "compute_preference",
    "fit_f_distribution",
    "sarle_bimodality_coefficient",
]
