# Copyright 2026 The twotower Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Comparing two runs' (or models') per-type preferences: their correlation over shared token types, towers matched.
"""

import numpy as np
from scipy import optimize

from .preference_stats import MIN_TYPES_FOR_CORRELATION


def compare_preferences(token_ids_a, preference_nats_a, token_ids_b, preference_nats_b):
    """Correlate two models' (or runs') per-type preferences over their shared token types, matching towers.

    Tower labels are arbitrary, so tower j of run B is matched to tower i of run A by the assignment
    that maximizes the summed correlation (for two towers: the larger of corr and -corr).

    Args:
        token_ids_a: [types] token ids of run A (pass only the types to compare, e.g. eligible ones).
        preference_nats_a: [towers, types] run A's preference_nats over those ids.
        token_ids_b: [types] token ids of run B.
        preference_nats_b: [towers, types] run B's preference_nats over those ids.

    Returns:
        dict with `correlation` (mean matched correlation), `tower_mapping` (run B's tower matched to each of
        run A's towers), `correlation_matrix` (towers of A by towers of B) and `num_shared_types`.

    Example:
        >>> comparison = compare_preferences(
        ...     [1, 2, 3], [[1.0, -1.0, 2.0], [-1.0, 1.0, -2.0]], [2, 3, 1], [[1.0, -2.0, -1.0], [-1.0, 2.0, 1.0]]
        ... )
        >>> comparison["correlation"], comparison["tower_mapping"], comparison["num_shared_types"]
        (1.0, [1, 0], 3)
    """
    token_ids_a, preference_a = _as_preference_table(token_ids_a, preference_nats_a, "a")
    token_ids_b, preference_b = _as_preference_table(token_ids_b, preference_nats_b, "b")
    if preference_a.shape[0] != preference_b.shape[0]:
        raise ValueError(
            f"run a has {preference_a.shape[0]} towers but run b has {preference_b.shape[0]}; "
            "tower preferences can only be matched between models with the same number of towers."
        )
    shared, index_a, index_b = np.intersect1d(token_ids_a, token_ids_b, return_indices=True)
    if shared.shape[0] < MIN_TYPES_FOR_CORRELATION:
        raise ValueError(
            f"the runs share {shared.shape[0]} token types; a correlation needs at least {MIN_TYPES_FOR_CORRELATION}."
        )
    preference_a, preference_b = preference_a[:, index_a], preference_b[:, index_b]
    for name, preference in (("a", preference_a), ("b", preference_b)):
        if (np.ptp(preference, axis=1) == 0).any():
            raise ValueError(
                f"run {name} has a tower whose preference is constant over the shared types; no correlation."
            )
    correlation, mapping, correlation_matrix = matched_correlation(preference_a, preference_b)
    return {
        "correlation": correlation,
        "tower_mapping": mapping.tolist(),
        "correlation_matrix": correlation_matrix.tolist(),
        "num_shared_types": int(shared.shape[0]),
    }


def matched_correlation(preference_a, preference_b):
    """
    (mean matched correlation, run B's tower matched to each of run A's, the correlation matrix) of two runs'
    preferences [towers, types] over the same types in the same order: `compare_preferences` after aligning types.
    """
    num_towers = preference_a.shape[0]
    correlation_matrix = np.corrcoef(preference_a, preference_b)[:num_towers, num_towers:]
    rows, mapping = optimize.linear_sum_assignment(correlation_matrix, maximize=True)
    return float(correlation_matrix[rows, mapping].mean()), mapping, correlation_matrix


def _as_preference_table(token_ids, preference_nats, name):
    token_ids = np.asarray(token_ids)
    preference_nats = np.asarray(preference_nats, dtype=np.float64)
    if preference_nats.ndim != 2 or preference_nats.shape[1] != token_ids.shape[0]:
        raise ValueError(
            f"preference_nats_{name} must be [towers, types] with one column per token id; got shape "
            f"{preference_nats.shape} for {token_ids.shape[0]} token ids."
        )
    if np.unique(token_ids).shape[0] != token_ids.shape[0]:
        raise ValueError(f"token_ids_{name} has repeated ids; pass one column per token type.")
    if not np.isfinite(preference_nats).all():
        raise ValueError(f"preference_nats_{name} has NaN or infinite values.")
    return token_ids, preference_nats


__all__ = [
    "compare_preferences",
    "matched_correlation",
]
