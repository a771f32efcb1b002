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
"""Tower preference from several probe replicas per tower, tested with the replica as unit of replication.

Probe replicas: a second probe trained on the same tower disagrees with the first per token type
about as much as the towers' probes do, so the occurrence-level test of one probe per tower mostly
tests one probe against another. ReplicaPreferenceAccumulator takes several probes per tower and
tests each type's preference against the spread between replicas (paired by training run when
given, with the replica variances moderated across types as in limma), and reports the
reliability of the per-type preference and the same-tower floor. Its summary adds "test":
"replica", occurrence_* copies of the occurrence-level significance, the probe layout
(num_probes, probe_towers, probe_runs, paired, replicas_per_tower), reliability, reliability_ci,
reliability_single_probe, prior_df, prior_variance, residual_df, two_tower_difference_nats and
same_tower_floor_nats.
"""

import itertools
import math

import numpy as np

from .moderation import fit_f_distribution, moderated_variance
from .preference_stats import (
    SIGNIFICANCE_KEYS,
    PreferenceAccumulator,
    PreferenceResult,
    preferred_tower_test,
    significance_summary,
    tower_contrast,
    validate_predictions,
)
from .reliability import finite_or_none, reliability_summary
from .summary import ReplicaSummary


def _check_probe_layout(probe_towers, probe_runs):
    """Validate which tower (and run) each probe belongs to; returns (probe_towers, run_probes [runs, towers] or None).

    run_probes[r, t] is the probe of tower t trained in run r. Since every tower has >= 2 probes and every run one
    probe of each tower, there are >= 2 runs.
    """
    probe_towers = np.asarray(probe_towers)
    if probe_towers.ndim != 1 or not np.issubdtype(probe_towers.dtype, np.integer):
        raise ValueError(
            f"probe_towers must be a list of tower indices, one int per probe; got {probe_towers.tolist()}."
        )
    towers, replicas = np.unique(probe_towers, return_counts=True)
    if towers.tolist() != list(range(towers.shape[0])) or towers.shape[0] < 2:
        raise ValueError(
            f"probe_towers must name towers 0, 1, ..., num_towers - 1 (at least 2, none skipped); got "
            f"probe_towers={probe_towers.tolist()}."
        )
    if replicas.min() < 2:
        raise ValueError(
            "the replica-level test needs at least 2 probe replicas per tower; got "
            f"probe_towers={probe_towers.tolist()} (tower {int(np.argmin(replicas))} has 1). Train more probes per "
            "tower (another seed or data order), or drop probe_towers for the occurrence-level test of one probe "
            "per tower."
        )
    if probe_runs is None:
        return probe_towers, None
    probe_runs = np.asarray(probe_runs)
    if probe_runs.shape != probe_towers.shape or not np.issubdtype(probe_runs.dtype, np.integer):
        raise ValueError(
            f"probe_runs must hold one int per probe, as probe_towers does ({probe_towers.shape[0]}); got "
            f"probe_runs={probe_runs.tolist()}."
        )
    run_probes = []
    for run in np.unique(probe_runs):
        in_run = np.flatnonzero(probe_runs == run)
        if sorted(probe_towers[in_run].tolist()) != towers.tolist():
            raise ValueError(
                f"run {run} holds probes of towers {sorted(probe_towers[in_run].tolist())}; with probe_runs every run "
                f"needs exactly one probe of every tower {towers.tolist()}. Drop probe_runs to compare independent "
                "replica means."
            )
        run_probes.append(in_run[np.argsort(probe_towers[in_run])])
    return probe_towers, np.stack(run_probes)


def _pair_differences(probe_logprob, pairs):
    """Per type, the mean over probe pairs (p, q) of |probe_logprob[p] - probe_logprob[q]|: [types]."""
    first, second = np.asarray(pairs).T
    return np.abs(probe_logprob[first] - probe_logprob[second]).mean(axis=0)


class ReplicaPreferenceAccumulator:
    """Tower preference from several probe replicas per tower, tested with the replica as unit of replication.

    A second probe trained on the same tower differs from the first about as much as the towers' probes do, so an
    occurrence-level test of one probe per tower mostly tests one probe against another. With K >= 2 probes per
    tower (other seeds or data orders), each type's preference is tested against how much the replicas differ:
    paired by training run when `probe_runs` is given (probes of one run share much of their per-type error, which
    the tower contrast within the run cancels), pooled within towers otherwise. The replica variances of all
    eligible types are shrunk towards a fitted prior (limma's moderated t, Smyth 2004), which gives a few replicas
    the power of many types. The occurrence-level test on each tower's replica-mean log-prob is kept alongside.

    Args:
        probe_towers: the tower (0 .. num_towers - 1) each probe reads, one int per row of gold_logprobs.
        probe_runs: optional, the training run each probe comes from; every run holds one probe of every tower.
        vocab_size: when given, larger token ids are rejected.

    Example:
        >>> accumulator = ReplicaPreferenceAccumulator(probe_towers=[0, 0, 1, 1], probe_runs=[0, 1, 0, 1])
        >>> gold_logprobs = [[-1.0, -1.5, -2.0], [-1.2, -1.3, -2.2], [-2.0, -2.5, -1.0], [-2.1, -2.6, -1.1]]
        >>> accumulator.update([3, 3, 4], gold_logprobs)  # [probes, predictions]
        >>> result = accumulator.compute(min_count=2)
        >>> result.preference_nats[0].round(2).tolist(), result.probe_mean_logprob.shape
        ([1.05, -1.05], (4, 2))
    """

    def __init__(self, probe_towers, probe_runs=None, vocab_size=None):
        self.probe_towers, self.run_probes = _check_probe_layout(probe_towers, probe_runs)
        self.probe_runs = None if probe_runs is None else [int(run) for run in probe_runs]
        self.replicas_per_tower = np.bincount(self.probe_towers)  # [towers]
        num_towers, num_probes = self.replicas_per_tower.shape[0], self.probe_towers.shape[0]
        reads_tower = np.arange(num_towers)[:, None] == self.probe_towers  # [towers, probes]
        self.replica_mean_weights = reads_tower / self.replicas_per_tower[:, None]  # weights @ logprobs: tower means
        self.occurrences = PreferenceAccumulator(num_towers, vocab_size)  # fed each tower's replica mean
        self.probe_sum_logprob = np.zeros((num_probes, vocab_size or 0))  # [probes, vocab] float64

    @property
    def num_towers(self):
        return self.occurrences.num_towers

    @property
    def num_probes(self):
        return self.probe_towers.shape[0]

    @property
    def num_predictions(self):
        return self.occurrences.num_predictions

    @property
    def num_replicas(self):
        """Replicas a tower's preference averages: the runs when paired, else the mean probes per tower."""
        return self.run_probes.shape[0] if self.run_probes is not None else float(self.replicas_per_tower.mean())

    def _match_capacity(self):
        padding = self.occurrences.count.shape[-1] - self.probe_sum_logprob.shape[-1]
        if padding > 0:
            self.probe_sum_logprob = np.pad(self.probe_sum_logprob, ((0, 0), (0, padding)))

    def update(self, token_ids, gold_logprobs):
        """Add predictions: token_ids [n] (gold ids, >= 0), gold_logprobs [probes, n] (each probe's log-prob)."""
        token_ids, gold_logprobs = validate_predictions(token_ids, gold_logprobs, self.occurrences.vocab_size)
        if gold_logprobs.shape[0] != self.num_probes:
            raise ValueError(
                f"gold_logprobs has {gold_logprobs.shape[0]} probe rows but probe_towers names {self.num_probes} "
                "probes; pass one row per probe, in probe_towers order."
            )
        self.occurrences.update(token_ids, self.replica_mean_weights @ gold_logprobs)  # [towers, n] float64
        self._match_capacity()
        capacity = self.probe_sum_logprob.shape[-1]
        for probe_idx, logprobs in enumerate(gold_logprobs):
            self.probe_sum_logprob[probe_idx] += np.bincount(token_ids, weights=logprobs, minlength=capacity)

    def merge(self, other):
        """Add another accumulator's statistics (same probes, e.g. gathered from another process); returns self."""
        if self.probe_towers.tolist() != other.probe_towers.tolist() or self.probe_runs != other.probe_runs:
            raise ValueError(
                f"cannot merge an accumulator of probe_towers={other.probe_towers.tolist()}, probe_runs="
                f"{other.probe_runs} into one of probe_towers={self.probe_towers.tolist()}, "
                f"probe_runs={self.probe_runs}."
            )
        if other.num_predictions == 0:
            return self
        self.occurrences.merge(other.occurrences)
        self._match_capacity()
        self.probe_sum_logprob[:, : other.probe_sum_logprob.shape[-1]] += other.probe_sum_logprob
        return self

    def _residual_variance(self, probe_logprob):
        """Replica noise of each type's tower contrast, from per-probe mean log-probs [probes, types].

        Returns (residual_variance [towers, types], residual_df, se_factor [towers, 1]): the squared standard
        error of preference_nats is residual_variance * se_factor.
        """
        if self.run_probes is not None:  # the contrast within each run, then its spread over runs
            num_runs = self.run_probes.shape[0]
            run_contrast = tower_contrast(probe_logprob[self.run_probes], axis=1)  # [runs, towers, types]
            return run_contrast.var(axis=0, ddof=1), num_runs - 1, np.full((self.num_towers, 1), 1.0 / num_runs)
        tower_mean = self.replica_mean_weights @ probe_logprob  # [towers, types]
        deviation = probe_logprob - tower_mean[self.probe_towers]
        residual_df = self.num_probes - self.num_towers
        pooled = (deviation**2).sum(axis=0) / residual_df  # [types], one variance for all towers' replicas
        inverse_replicas = 1.0 / self.replicas_per_tower
        # Var(tower t's mean - mean of the others' means) / variance of one replica
        se_factor = inverse_replicas + (inverse_replicas.sum() - inverse_replicas) / (self.num_towers - 1) ** 2
        return np.broadcast_to(pooled, (self.num_towers, pooled.shape[0])), residual_df, se_factor[:, None]

    def _probe_pairs(self):
        """(pairs of probes of two towers from two runs, pairs of probes of one tower): lists of (p, q)."""
        two_tower, same_tower = [], []
        for first, second in itertools.combinations(range(self.num_probes), 2):
            if self.probe_towers[first] == self.probe_towers[second]:
                same_tower.append((first, second))
            elif self.probe_runs is None or self.probe_runs[first] != self.probe_runs[second]:
                two_tower.append((first, second))
        return two_tower, same_tower

    def compute(self, alpha=0.05, min_count=10, top_k=20, center=False):
        """Per-type preference with the replica-level test, and the occurrence-level one, as a PreferenceResult.

        The options are PreferenceAccumulator.compute's. With center=True each probe's per-type mean log-prob is
        first taken relative to its mean over all predictions, so a replica or tower that is better overall
        neither shifts every type's preference nor adds to the replica noise.
        """
        occurrence = self.occurrences.compute(alpha=alpha, min_count=min_count, top_k=top_k, center=center)
        token_ids, count, eligible = occurrence.token_ids, occurrence.count, occurrence.eligible
        probe_logprob = self.probe_sum_logprob[:, token_ids] / count  # [probes, types]
        compared_logprob = probe_logprob
        if center:
            compared_logprob = probe_logprob - (self.probe_sum_logprob.sum(axis=1) / count.sum())[:, None]

        residual_variance, residual_df, se_factor = self._residual_variance(compared_logprob)
        # one prior for all: with two towers (or pooled replicas) every contrast row has the same variances
        pooled_rows = self.run_probes is not None and self.num_towers > 2
        fitted_rows = residual_variance if pooled_rows else residual_variance[:1]
        prior_df, prior_variance = fit_f_distribution(fitted_rows[:, eligible].ravel(), residual_df)
        posterior_variance = moderated_variance(residual_variance, residual_df, prior_df, prior_variance)
        standard_error = np.sqrt(posterior_variance * se_factor)  # [towers, types]
        preferred_tower, p_value, significant = preferred_tower_test(
            occurrence.preference_nats, standard_error, residual_df + prior_df, eligible, alpha
        )

        two_tower_pairs, same_tower_pairs = self._probe_pairs()
        result = PreferenceResult(
            token_ids=token_ids,
            count=count,
            mean_logprob=occurrence.mean_logprob,
            preference_nats=occurrence.preference_nats,
            standard_error=standard_error,
            preferred_tower=preferred_tower,
            p_value=p_value,
            eligible=eligible,
            significant=significant,
            probe_mean_logprob=probe_logprob,
            occurrence_standard_error=occurrence.standard_error,
            occurrence_p_value=occurrence.p_value,
            occurrence_significant=occurrence.significant,
            two_tower_difference_per_type_nats=_pair_differences(compared_logprob, two_tower_pairs),
            same_tower_difference_per_type_nats=_pair_differences(compared_logprob, same_tower_pairs),
        )
        sampling_variance = residual_variance * se_factor  # unmoderated: the replicas' own noise
        result.summary = self._summary(occurrence, result, sampling_variance, prior_df, prior_variance, residual_df)
        return result

    def _summary(self, occurrence, result, sampling_variance, prior_df, prior_variance, residual_df) -> ReplicaSummary:
        """The replica-level summary (summary.py) of `result`, around the occurrence-level test's."""
        eligible = result.eligible
        rows = slice(1) if self.num_towers == 2 else slice(None)  # with two towers row 1 mirrors row 0
        return {
            "test": "replica",
            **occurrence.summary,
            **significance_summary(result.significant, result.preferred_tower, self.num_towers, int(eligible.sum())),
            **{f"occurrence_{key}": occurrence.summary[key] for key in SIGNIFICANCE_KEYS},
            "num_probes": self.num_probes,
            "probe_towers": self.probe_towers.tolist(),
            "probe_runs": self.probe_runs,
            "paired": self.probe_runs is not None,
            "replicas_per_tower": self.replicas_per_tower.tolist(),
            **reliability_summary(
                result.preference_nats[rows][:, eligible], sampling_variance[rows][:, eligible], self.num_replicas
            ),
            "prior_df": None if math.isinf(prior_df) else float(prior_df),
            "prior_variance": finite_or_none(prior_variance),
            "residual_df": int(residual_df),
            "two_tower_difference_nats": _mean_or_none(result.two_tower_difference_per_type_nats[eligible]),
            "same_tower_floor_nats": _mean_or_none(result.same_tower_difference_per_type_nats[eligible]),
        }


def _mean_or_none(values):
    return float(values.mean()) if values.shape[0] else None


def compute_preference(
    token_ids, gold_logprobs, *, alpha=0.05, min_count=10, top_k=20, center=False, vocab_size=None,
    probe_towers=None, probe_runs=None,
):
    """One-shot tower preference: token_ids [n], gold_logprobs [towers, n] -> PreferenceResult.

    The options are PreferenceAccumulator.compute's; vocab_size, when given, rejects larger token ids. With
    probe_towers (and optionally probe_runs), gold_logprobs has one row per probe replica, [probes, n], and the
    result carries the replica-level test (see ReplicaPreferenceAccumulator).

    Example:
        >>> result = compute_preference([3, 3, 4, 4], [[-1.0, -1.2, -3.0, -3.2], [-2.0, -2.4, -1.0, -1.0]], min_count=2)
        >>> result.preference_nats[0].round(2).tolist(), result.preferred_tower.tolist()
        ([1.1, -2.1], [0, 1])
    """
    if probe_towers is not None:
        accumulator = ReplicaPreferenceAccumulator(probe_towers, probe_runs, vocab_size)
    elif probe_runs is not None:
        raise ValueError(
            f"probe_runs={list(probe_runs)} needs probe_towers, the tower each probe reads; pass both, or neither "
            "for one probe per tower."
        )
    else:
        accumulator = PreferenceAccumulator(vocab_size=vocab_size)
    accumulator.update(token_ids, gold_logprobs)
    return accumulator.compute(alpha=alpha, min_count=min_count, top_k=top_k, center=center)


__all__ = [
    "ReplicaPreferenceAccumulator",
    "compute_preference",
]
