"""Measuring tower preference: the statistics core, the scoring pipeline and its report."""

from .tower_preference.comparisons import compare_preferences
from .tower_preference.moderation import fit_f_distribution
from .tower_preference.preference_stats import PreferenceAccumulator, PreferenceResult, sarle_bimodality_coefficient
from .tower_preference.replica_preference import ReplicaPreferenceAccumulator, compute_preference


__all__ = [
    "PreferenceAccumulator",
    "PreferenceResult",
    "ReplicaPreferenceAccumulator",
    "compare_preferences",
    "compute_preference",
    "fit_f_distribution",
    "sarle_bimodality_coefficient",
]
