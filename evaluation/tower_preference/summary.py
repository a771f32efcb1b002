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
"""The summary of a tower preference computation, every key declared once.

`PreferenceResult.summary`, the scalar part of the metric's `compute` output and the "summary" of the scoring
command's preference.json hold exactly these keys: `OccurrenceSummary` for one probe per tower, `ReplicaSummary`
for the replica-level test. Readers elsewhere (the report, the study, the benchmarks) name keys declared here;
tests/test_summary_keys.py checks both directions. "Eligible" types are those seen at least `min_count` times.
"""

from typing import Literal, TypedDict


class OccurrenceSummary(TypedDict):
    """The occurrence-level test's summary (one probe per tower); lists hold one entry per tower."""

    num_towers: int
    num_predictions: int
    num_token_types: int  # types observed at least once
    num_eligible_types: int
    num_excluded_types: int  # observed but below min_count
    min_count: int
    alpha: float  # Benjamini-Hochberg false discovery rate
    global_offset_nats: list[float]  # each tower's occurrence-weighted mean preference
    centered: bool  # whether the offset was subtracted before testing
    type_share_preferring: list[float | None]  # share of eligible types whose preferred tower is t
    occurrence_share_preferring: list[float | None]  # the same, weighted by occurrences
    mean_abs_preference_nats: float | None  # the preferred tower's margin, averaged over eligible types
    num_significant: int
    significant_share: float | None  # of eligible types
    num_significant_preferring: list[int]
    split_half_consistency: float | None  # Pearson's r of the preference between two halves of the text
    bimodality_coefficient: float | None  # Sarle's, of the preference over eligible types
    top_token_ids: list[list[int]]  # per tower: the eligible types preferring it, by preference, top_k at most
    top_preference_nats: list[list[float]]


class ReplicaSummary(OccurrenceSummary):
    """The replica-level test's summary (several probes per tower): num_significant, significant_share and
    num_significant_preferring are this test's; the occurrence-level test of the replica means keeps its own."""

    test: Literal["replica"]
    occurrence_num_significant: int
    occurrence_significant_share: float | None
    occurrence_num_significant_preferring: list[int]
    num_probes: int
    probe_towers: list[int]  # the tower each probe reads
    probe_runs: list[int] | None  # the run each probe came from; None when unpaired
    paired: bool
    replicas_per_tower: list[int]
    reliability: float | None  # 1 - mean squared replica-level standard error / variance over eligible types
    reliability_ci: list[float | None]  # 95% percentile bootstrap over token types
    reliability_single_probe: float | None  # stepped down to one probe per tower (Spearman-Brown)
    prior_df: float | None  # the moderated variance prior's degrees of freedom; None when infinite
    prior_variance: float | None
    residual_df: int
    two_tower_difference_nats: float | None  # mean |difference| of two towers' probes from two runs
    same_tower_floor_nats: float | None  # the same for two probes of one tower: the noise floor


OCCURRENCE_SUMMARY_KEYS = tuple(OccurrenceSummary.__annotations__)
REPLICA_SUMMARY_KEYS = tuple(ReplicaSummary.__annotations__)


def summary_keys(*keys: str) -> tuple[str, ...]:
    """`keys`, checked to be declared summary keys: for module-level selections of the summary."""
    unknown = [key for key in keys if key not in REPLICA_SUMMARY_KEYS]
    if unknown:
        raise KeyError(f"{unknown} are not tower preference summary keys; the keys are declared in summary.py.")
    return keys


__all__ = [
    "OCCURRENCE_SUMMARY_KEYS",
    "OccurrenceSummary",
    "REPLICA_SUMMARY_KEYS",
    "ReplicaSummary",
    "summary_keys",
]
