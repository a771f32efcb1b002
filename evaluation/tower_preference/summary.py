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
tests/metric/test_summary_keys.py checks both directions. "Eligible" types are those seen at least `min_count` times.
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

# What each key means, once: the metric's Returns docstring is built from these, and the metric card's Output Values
# and docs/preference.md's table are checked against them (tests/metric/test_summary_keys.py; scripts/summary_keys_docs.py
# rewrites both). Markdown code spans are kept plain enough for a docstring.
SUMMARY_KEY_DESCRIPTIONS = {
    "num_towers": "towers of the model (probes are grouped by tower)",
    "num_predictions": "predictions given (scored tokens)",
    "num_token_types": "token types observed at least once",
    "num_eligible_types": "token types observed at least `min_count` times: the summary's types",
    "num_excluded_types": "token types observed, but fewer than `min_count` times",
    "min_count": "the eligibility threshold given",
    "alpha": "the Benjamini-Hochberg false discovery rate given",
    "global_offset_nats": "each tower's preference over all predictions (the occurrence-weighted mean preference; for "
    "two towers `[d, -d]`, d the difference of the probes' log perplexities)",
    "centered": "whether the global offset was subtracted from every type's preference before testing",
    "type_share_preferring": "per tower, the share of eligible types whose preferred tower it is (sums to 1)",
    "occurrence_share_preferring": "the same, weighted by the types' occurrences",
    "mean_abs_preference_nats": "mean over eligible types of the preferred tower's preference (two towers: the mean "
    "absolute preference)",
    "num_significant": "eligible types whose preference is significant after Benjamini-Hochberg at `alpha` (with "
    "probe replicas, in the replica-level test)",
    "significant_share": "`num_significant` over the eligible types; None without eligible types",
    "num_significant_preferring": "per tower, the significant types preferring it",
    "split_half_consistency": "Pearson's r of the per-type preference between two halves of the predictions, "
    "averaged over towers (-1 to 1); None with fewer than 3 eligible types",
    "bimodality_coefficient": "Sarle's, of the preference over eligible types, averaged over towers (0 to 1; above "
    "5/9 suggests two groups); None with fewer than 4 eligible types",
    "top_token_ids": "per tower, its most preferred eligible types, strongest first (`top_k` at most)",
    "top_preference_nats": "their preferences, in the same order",
    "test": "\"replica\" (absent without probe replicas)",
    "occurrence_num_significant": "the occurrence-level test of the towers' replica means: its `num_significant`",
    "occurrence_significant_share": "its `significant_share`",
    "occurrence_num_significant_preferring": "its `num_significant_preferring`",
    "num_probes": "probes given (replicas of all towers)",
    "probe_towers": "the tower each probe reads",
    "probe_runs": "the training run each probe came from; None when unpaired",
    "paired": "whether the probes of a run are paired in the test",
    "replicas_per_tower": "probes of each tower",
    "reliability": "1 - mean squared replica-level standard error / variance of the preference over eligible types "
    "(about 0: probe noise; about 1: the preference is the towers'; may dip below 0 by chance); None with fewer "
    "than 3 eligible types",
    "reliability_ci": "`[low, high]`, its 95% percentile bootstrap interval over token types",
    "reliability_single_probe": "the reliability stepped down to one probe per tower (Spearman-Brown)",
    "prior_df": "the moderated variance prior's degrees of freedom (d0); None when infinite",
    "prior_variance": "the prior's variance (s0 squared); None without moderation",
    "residual_df": "the residual degrees of freedom of each type's replica-level test (d)",
    "two_tower_difference_nats": "mean over eligible types of the mean absolute difference of the per-type mean "
    "log-probs of two probes of two towers from two runs",
    "same_tower_floor_nats": "the same for two probes of one tower: the noise floor",
}


def summary_key_lines(keys=REPLICA_SUMMARY_KEYS, style="markdown") -> list[str]:
    """One line per key with its description: a Markdown list item, a Markdown table row or a docstring line."""
    line = {"markdown": "- `{}`: {}", "table": "| `{}` | {} |", "docstring": "{}: {}"}[style]
    return [line.format(key, SUMMARY_KEY_DESCRIPTIONS[key]) for key in keys]


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
    "SUMMARY_KEY_DESCRIPTIONS",
    "summary_key_lines",
    "summary_keys",
]
