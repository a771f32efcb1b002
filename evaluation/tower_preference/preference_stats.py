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
"""Per-token-type tower preference statistics: the numerical core of the tower_preference metric.

Input, per predicted token: its gold token id and each tower probe's log-probability of it.
Output, per token type: count, mean log-probability under each tower, preference in nats with
its standard error and p-value, plus a summary (shares preferring each tower, significance after
Benjamini-Hochberg, split-half consistency, bimodality, top tokens of each tower).

Sign convention: the preference of tower t is its mean log-probability minus the mean of the
other towers' mean log-probabilities, in nats; positive means tower t predicts the type better.
With two towers, row 0 is tower 0 minus tower 1 and row 1 is its negative.

Global offset: when one tower is better overall (lower probe perplexity), every type's preference
shifts the same way. The offset of tower t is the occurrence-weighted mean of its per-occurrence
preference, i.e. the preference of the mean log-probability over all predictions (with two towers,
the difference of the probes' log perplexities). It is always reported; with center=True it is
subtracted from every type's preference before testing, so what remains is each type's preference
relative to the towers' overall difference.

The replica-level test (several probes per tower) is replica_preference.py's; moderation.py fits its variance
prior, reliability.py its reliability and interval, comparisons.py correlates two runs' preferences. These files
need only numpy and scipy, so the `evaluate` module beside them and the twotower package (`twotower.evaluation`)
share one copy of the maths.
"""

import math
from dataclasses import dataclass, field

import numpy as np
from scipy import special
from scipy import stats

from .summary import OccurrenceSummary, ReplicaSummary


CHUNK_SIZE = 1 << 16  # predictions aggregated per pass: keeps the sort and bincount working set in cache
NUM_HALVES = 2  # occurrence i of a token type goes to half i % 2 (split-half consistency)
MIN_TYPES_FOR_CORRELATION = 3  # a correlation over fewer token types is meaningless
MIN_TYPES_FOR_BIMODALITY = 4  # Sarle's coefficient needs the bias-corrected kurtosis, defined from n = 4
SIGNIFICANCE_KEYS = ("num_significant", "significant_share", "num_significant_preferring")


def validate_predictions(token_ids, gold_logprobs, vocab_size=None):
    """Check one batch of predictions and return it as (token_ids int64 [n], gold_logprobs floating [towers, n]).

    Floating log-probs keep their dtype (float32 model outputs are widened to float64 chunk by chunk
    during aggregation, not all at once); anything else is converted to float64.

    Raises ValueError naming the bad value and the fix: empty input, fewer than 2 towers, mismatched
    lengths, non-integer or negative token ids (or ids >= vocab_size when given), NaN or infinite
    log-probabilities, positive log-probabilities.
    """
    token_ids = np.asarray(token_ids)
    gold_logprobs = np.asarray(gold_logprobs)
    if not np.issubdtype(gold_logprobs.dtype, np.floating):
        gold_logprobs = gold_logprobs.astype(np.float64)
    if token_ids.size == 0:
        raise ValueError("token_ids is empty: pass at least one prediction (drop empty batches before updating).")
    if token_ids.ndim != 1:
        raise ValueError(f"token_ids must be 1-D [num_predictions]; got shape {token_ids.shape}. Flatten it first.")
    if not np.issubdtype(token_ids.dtype, np.integer):
        raise ValueError(f"token_ids must be integers; got dtype {token_ids.dtype}.")
    if gold_logprobs.ndim != 2:
        raise ValueError(
            f"gold_logprobs must be 2-D [num_towers, num_predictions]; got shape {gold_logprobs.shape}."
        )
    num_towers, num_predictions = gold_logprobs.shape
    if num_towers < 2:
        raise ValueError(
            f"gold_logprobs has {num_towers} tower row(s); preference needs at least 2 towers. It is shaped "
            "[num_towers, num_predictions]: transpose it if you have one row per prediction."
        )
    if num_predictions != token_ids.shape[0]:
        raise ValueError(
            f"token_ids has {token_ids.shape[0]} predictions but gold_logprobs has {num_predictions} per tower "
            f"(shape {gold_logprobs.shape}); both must describe the same predictions."
        )
    if token_ids.min() < 0:
        position = int(np.argmin(token_ids))
        raise ValueError(
            f"token_ids must be >= 0; got {token_ids[position]} at prediction {position}. Drop ignored "
            "positions (label -100, padding) before updating."
        )
    if vocab_size is not None and token_ids.max() >= vocab_size:
        position = int(np.argmax(token_ids))
        raise ValueError(
            f"token_ids must be < vocab_size={vocab_size}; got {token_ids[position]} at prediction {position}."
        )
    lowest, highest = gold_logprobs.min(), gold_logprobs.max()
    if not (np.isfinite(lowest) and np.isfinite(highest)):  # NaN propagates through min and max
        tower_idx, position = np.argwhere(~np.isfinite(gold_logprobs))[0]
        raise ValueError(
            f"gold_logprobs must be finite; got {gold_logprobs[tower_idx, position]} at tower {tower_idx}, "
            f"prediction {position}. Check the model's outputs (e.g. an overflow in half precision)."
        )
    if highest > 0.0:
        tower_idx, position = np.unravel_index(np.argmax(gold_logprobs), gold_logprobs.shape)
        raise ValueError(
            f"gold_logprobs must be log-probabilities (<= 0); got {gold_logprobs[tower_idx, position]} at tower "
            f"{tower_idx}, prediction {position}. Pass log-probabilities, not probabilities; negate losses (NLL)."
        )
    return token_ids.astype(np.int64, copy=False), gold_logprobs


def tower_contrast(values, axis=0):
    """Each tower's value minus the mean of the other towers' values; towers lie along `axis`."""
    num_towers = values.shape[axis]
    return values - (values.sum(axis=axis, keepdims=True) - values) / (num_towers - 1)


def _occurrence_halves(token_ids, seen_counts):
    """Half (0 or 1) of each prediction: the parity of its occurrence index within its token type.

    seen_counts[v] is how many occurrences of type v earlier updates saw, so halves interleave
    across batches too. A stable sort groups each type's occurrences in stream order.
    """
    # numpy's stable sort is a linear-time radix sort for 16-bit keys, the common vocabulary size
    sort_keys = token_ids.astype(np.uint16) if token_ids.max() < (1 << 16) else token_ids
    order = np.argsort(sort_keys, kind="stable")
    sorted_ids = sort_keys[order]
    positions = np.arange(sorted_ids.shape[0])
    is_run_start = np.empty(sorted_ids.shape[0], dtype=bool)
    is_run_start[0] = True
    np.not_equal(sorted_ids[1:], sorted_ids[:-1], out=is_run_start[1:])
    run_start = positions * is_run_start
    np.maximum.accumulate(run_start, out=run_start)  # sorted position where each prediction's type run starts
    occurrence_index = positions - run_start
    occurrence_index += seen_counts[sorted_ids]
    halves = np.empty(sorted_ids.shape[0], dtype=np.int64)
    halves[order] = occurrence_index & 1  # i % NUM_HALVES, in place of a slower integer modulo
    return halves


def _pearson(x, y):
    """Pearson correlation of two 1-D arrays, or None when it is undefined (too few or constant values)."""
    if x.shape[0] < MIN_TYPES_FOR_CORRELATION or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(x, y)[0, 1])


def sarle_bimodality_coefficient(values):
    """Sarle's bimodality coefficient (skewness^2 + 1) / (excess kurtosis + 3 (n-1)^2 / ((n-2)(n-3))).

    Uses the bias-corrected sample skewness and kurtosis. A uniform distribution gives 5/9 ~ 0.556; larger
    values suggest two modes, a normal distribution gives ~1/3. None when undefined (n < 4 or constant values).
    """
    n = values.shape[0]
    if n < MIN_TYPES_FOR_BIMODALITY or np.ptp(values) == 0:
        return None
    skewness = stats.skew(values, bias=False)
    excess_kurtosis = stats.kurtosis(values, bias=False)
    return float((skewness**2 + 1) / (excess_kurtosis + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3))))


@dataclass
class PreferenceResult:
    """Per-token-type preference arrays (over the observed token types, sorted by id) and a summary.

    Shapes: [types], [towers, types] or [probes, types]. `summary` holds plain Python numbers and lists.
    With several probe replicas per tower (ReplicaPreferenceAccumulator), mean_logprob and preference_nats are
    those of each tower's replica mean, standard_error, p_value and significant are the replica-level test's,
    and the optional fields below are set; otherwise they are None.
    """

    token_ids: np.ndarray  # [types] int64, observed token ids in increasing order
    count: np.ndarray  # [types] int64, occurrences of each type
    mean_logprob: np.ndarray  # [towers, types] mean gold log-probability under each tower's probe
    preference_nats: np.ndarray  # [towers, types] tower t minus the mean of the other towers (minus the global
    # offset when centered)
    standard_error: np.ndarray  # [towers, types] of preference_nats, paired over occurrences; NaN if count < 2
    preferred_tower: np.ndarray  # [types] argmax of preference_nats
    p_value: np.ndarray  # [types] two-sided t-test of the preferred tower's preference (Bonferroni over towers if > 2)
    eligible: np.ndarray  # [types] bool, count >= min_count (enters shares, significance and consistency)
    significant: np.ndarray  # [types] bool, Benjamini-Hochberg at alpha among eligible types
    summary: OccurrenceSummary | ReplicaSummary = field(default_factory=dict)  # keys: summary.py
    probe_mean_logprob: np.ndarray = None  # [probes, types] mean gold log-probability under each probe replica
    occurrence_standard_error: np.ndarray = None  # [towers, types] the occurrence-level test on replica means
    occurrence_p_value: np.ndarray = None  # [types]
    occurrence_significant: np.ndarray = None  # [types] bool
    # [types] mean |difference| of the per-type mean log-probs of two probes from two runs, of two towers or of one;
    # their means over eligible types are summary["two_tower_difference_nats"] and summary["same_tower_floor_nats"]
    two_tower_difference_per_type_nats: np.ndarray = None
    same_tower_difference_per_type_nats: np.ndarray = None

    def to_dict(self):
        """Summary plus the per-type arrays as plain Python lists (JSON- and `evaluate`-friendly).

        The optional replica fields are included only when set.
        """
        per_type = {
            "token_ids": self.token_ids.tolist(),
            "count": self.count.tolist(),
            "mean_logprob": self.mean_logprob.tolist(),
            "preference_nats": self.preference_nats.tolist(),
            "standard_error": _nan_to_none(self.standard_error.tolist()),
            "preferred_tower": self.preferred_tower.tolist(),
            "p_value": _nan_to_none(self.p_value.tolist()),
            "eligible": self.eligible.tolist(),
            "significant": self.significant.tolist(),
        }
        for name in REPLICA_FIELDS:
            values = getattr(self, name)
            if values is not None:
                per_type[name] = _nan_to_none(values.tolist())
        return {**self.summary, **per_type}


REPLICA_FIELDS = (
    "probe_mean_logprob",
    "occurrence_standard_error",
    "occurrence_p_value",
    "occurrence_significant",
    "two_tower_difference_per_type_nats",
    "same_tower_difference_per_type_nats",
)


def _nan_to_none(values):
    """Replace NaN with None in a (nested) list, since JSON has no NaN."""
    if isinstance(values, list):
        return [_nan_to_none(value) for value in values]
    return None if math.isnan(values) else values


class PreferenceAccumulator:
    """Sufficient statistics of tower preference per token type, updated batch by batch.

    Occurrence i of a token type (counted in stream order over all updates) goes to half i % 2. For
    each half and token type it keeps the count and, per tower, the sum of gold log-probabilities and
    the sum of squared per-occurrence preferences, so tens of millions of predictions never sit in
    memory at once. Arrays grow as larger token ids appear, unless vocab_size fixes them.

    Example:
        >>> accumulator = PreferenceAccumulator()
        >>> accumulator.update([3, 3, 4], [[-1.0, -1.5, -2.0], [-2.0, -2.5, -1.0]])  # [towers, predictions]
        >>> result = accumulator.compute(min_count=2)
        >>> result.token_ids.tolist(), result.preference_nats[0].tolist()
        ([3, 4], [1.0, -1.0])
    """

    def __init__(self, num_towers=None, vocab_size=None):
        if num_towers is not None and num_towers < 2:
            raise ValueError(f"num_towers must be >= 2; got {num_towers}.")
        if vocab_size is not None and vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1; got {vocab_size}.")
        self.num_towers = num_towers
        self.vocab_size = vocab_size
        self.count = None  # [halves, vocab] int64
        self.sum_logprob = None  # [halves, towers, vocab] float64
        self.sum_sq_preference = None  # [halves, towers, vocab] float64
        if num_towers is not None:
            self._allocate(num_towers, vocab_size or 0)

    @property
    def num_predictions(self):
        return 0 if self.count is None else int(self.count.sum())

    def _allocate(self, num_towers, capacity):
        self.num_towers = num_towers
        self.count = np.zeros((NUM_HALVES, capacity), dtype=np.int64)
        self.sum_logprob = np.zeros((NUM_HALVES, num_towers, capacity))
        self.sum_sq_preference = np.zeros((NUM_HALVES, num_towers, capacity))

    def _grow(self, needed):
        capacity = self.count.shape[-1]
        if needed > capacity:
            # grow by half again at least, so a stream of ever larger ids costs amortized O(1) copies
            padding = max(needed, capacity + capacity // 2) - capacity
            self.count = np.pad(self.count, ((0, 0), (0, padding)))
            self.sum_logprob = np.pad(self.sum_logprob, ((0, 0), (0, 0), (0, padding)))
            self.sum_sq_preference = np.pad(self.sum_sq_preference, ((0, 0), (0, 0), (0, padding)))

    def update(self, token_ids, gold_logprobs):
        """Add predictions: token_ids [n] (gold ids, >= 0), gold_logprobs [towers, n] (each probe's log-prob)."""
        token_ids, gold_logprobs = validate_predictions(token_ids, gold_logprobs, self.vocab_size)
        num_towers = gold_logprobs.shape[0]
        if self.count is None:
            self._allocate(num_towers, self.vocab_size or 0)
        elif num_towers != self.num_towers:
            raise ValueError(
                f"gold_logprobs has {num_towers} towers but this accumulator holds {self.num_towers}; "
                "use one accumulator per model."
            )
        self._grow(int(token_ids.max()) + 1)
        for start in range(0, token_ids.shape[0], CHUNK_SIZE):
            end = start + CHUNK_SIZE
            self._update_chunk(token_ids[start:end], gold_logprobs[:, start:end])

    def _update_chunk(self, token_ids, gold_logprobs):
        gold_logprobs = gold_logprobs.astype(np.float64)  # sums of squares need the precision
        capacity = self.count.shape[-1]
        halves = _occurrence_halves(token_ids, self.count.sum(axis=0))
        # dense bins over (half, token type): sequential memory access, which beats gathering only the
        # chunk's types even when the chunk holds few of them
        bins = halves * capacity + token_ids
        num_bins = NUM_HALVES * capacity

        def sum_per_bin(weights=None):  # [halves, vocab]
            return np.bincount(bins, weights=weights, minlength=num_bins).reshape(NUM_HALVES, capacity)

        self.count += sum_per_bin()
        for tower_idx in range(self.num_towers):
            self.sum_logprob[:, tower_idx] += sum_per_bin(gold_logprobs[tower_idx])
        if self.num_towers == 2:  # tower 1's preference is minus tower 0's: one set of squares serves both
            self.sum_sq_preference += sum_per_bin((gold_logprobs[0] - gold_logprobs[1]) ** 2)[:, None]
        else:
            sq_preference = tower_contrast(gold_logprobs) ** 2  # [towers, n]
            for tower_idx in range(self.num_towers):
                self.sum_sq_preference[:, tower_idx] += sum_per_bin(sq_preference[tower_idx])

    def merge(self, other):
        """Add another accumulator's statistics (e.g. gathered from another process); returns self.

        Each accumulator interleaves its own occurrences, so the halves stay disjoint and balanced.
        """
        if other.count is None:
            return self
        if self.count is None:
            self._allocate(other.num_towers, self.vocab_size or 0)
        elif other.num_towers != self.num_towers:
            raise ValueError(f"cannot merge an accumulator of {other.num_towers} towers into one of {self.num_towers}.")
        other_capacity = other.count.shape[-1]
        self._grow(other_capacity)
        self.count[:, :other_capacity] += other.count
        self.sum_logprob[..., :other_capacity] += other.sum_logprob
        self.sum_sq_preference[..., :other_capacity] += other.sum_sq_preference
        return self

    def compute(self, alpha=0.05, min_count=10, top_k=20, center=False):
        """Per-type preference statistics and their summary, as a PreferenceResult.

        Args:
            alpha: false discovery rate of the Benjamini-Hochberg procedure, in (0, 1).
            min_count: token types with fewer occurrences are excluded from shares, significance,
                split-half consistency, bimodality and top tokens (they are still listed per type). >= 2.
            top_k: how many of each tower's most preferred token types the summary lists. >= 0.
            center: subtract the global offset (summary["global_offset_nats"]) from every type's preference,
                split halves included, before the preferred tower, p-values and summary are computed, so a
                tower that is better overall does not make every type prefer it. mean_logprob and
                standard_error are unchanged.
        """
        check_compute_options(alpha, min_count, top_k)
        if self.num_predictions == 0:
            raise ValueError("no predictions to compute preference from: call update() with at least one batch.")

        token_ids = np.flatnonzero(self.count.sum(axis=0))
        half_count = self.count[:, token_ids]  # [halves, types]
        count = half_count.sum(axis=0)
        half_sum_logprob = self.sum_logprob[..., token_ids]  # [halves, towers, types]
        sum_preference = tower_contrast(half_sum_logprob.sum(axis=0))  # [towers, types]
        sum_sq_preference = self.sum_sq_preference[..., token_ids].sum(axis=0)
        # the preference of the mean log-prob over all predictions: the occurrence-weighted mean preference
        global_offset = sum_preference.sum(axis=1) / count.sum()  # [towers]
        shift = global_offset[:, None] if center else 0.0  # [towers, 1]

        mean_logprob = half_sum_logprob.sum(axis=0) / count
        preference_nats = sum_preference / count - shift
        # a constant shift leaves the variance alone: the t-test of preference - offset uses the same error
        standard_error = _paired_standard_error(sum_preference, sum_sq_preference, count)
        eligible = count >= min_count
        preferred_tower, p_value, significant = preferred_tower_test(
            preference_nats, standard_error, np.maximum(count - 1, 1), eligible, alpha
        )

        with np.errstate(invalid="ignore", divide="ignore"):  # a type absent from a half gets NaN there
            half_mean_logprob = half_sum_logprob / half_count[:, None, :]
        half_preference = tower_contrast(half_mean_logprob, axis=1) - shift  # [halves, towers, types]
        result = PreferenceResult(
            token_ids=token_ids,
            count=count,
            mean_logprob=mean_logprob,
            preference_nats=preference_nats,
            standard_error=standard_error,
            preferred_tower=preferred_tower,
            p_value=p_value,
            eligible=eligible,
            significant=significant,
        )
        result.summary = _summarize(result, half_preference, alpha, min_count, top_k, global_offset, center)
        return result


def check_compute_options(alpha, min_count, top_k):
    """Refuse options of `compute` out of their ranges, naming the value."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1); got {alpha}.")
    if int(min_count) != min_count or min_count < 2:
        raise ValueError(f"min_count must be an integer >= 2 (a standard error needs 2 occurrences); got {min_count}.")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0; got {top_k}.")


def _paired_standard_error(sum_preference, sum_sq_preference, count):
    """Standard error [towers, types] of each mean preference, from running sums; NaN for a single occurrence.

    Every occurrence carries all towers' log-probs, so the per-occurrence preference is a paired difference:
    the squared standard error is its sample variance over the count.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        variance = (sum_sq_preference - sum_preference**2 / count) / (count - 1)
    return np.where(count < 2, np.nan, np.sqrt(np.maximum(variance, 0.0) / count))


def _two_sided_p_value(preference_nats, standard_error, df):
    """p-value [types] of a t-test of preference 0 with df degrees of freedom (inf: normal); NaN where the error is."""
    with np.errstate(invalid="ignore", divide="ignore"):
        t_statistic = np.abs(preference_nats) / standard_error
    # identical per-occurrence preferences: zero error, so any nonzero mean is certain and a zero mean is not
    t_statistic = np.where(standard_error == 0, np.where(preference_nats == 0, 0.0, np.inf), t_statistic)
    return 2 * special.stdtr(df, -t_statistic)  # stdtr is the t distribution's CDF


def preferred_tower_test(preference_nats, standard_error, df, eligible, alpha):
    """(preferred_tower, p_value, significant) [types]: the t-test of each type's preferred tower, then
    Benjamini-Hochberg at alpha among the eligible types."""
    num_towers = preference_nats.shape[0]
    preferred_tower = np.argmax(preference_nats, axis=0)
    preferred = (preferred_tower, np.arange(preferred_tower.shape[0]))
    p_value = _two_sided_p_value(preference_nats[preferred], standard_error[preferred], df)
    if num_towers > 2:  # the preferred tower was picked among num_towers contrasts
        p_value = np.minimum(p_value * num_towers, 1.0)
    significant = np.zeros_like(eligible)
    if eligible.any():
        significant[eligible] = stats.false_discovery_control(p_value[eligible], method="bh") <= alpha
    return preferred_tower, p_value, significant


def _summarize(result, half_preference, alpha, min_count, top_k, global_offset, center) -> OccurrenceSummary:
    """The summary of plain Python numbers and lists (its keys: summary.py)."""
    num_towers = result.preference_nats.shape[0]
    eligible = result.eligible
    preference = result.preference_nats[:, eligible]  # [towers, eligible types]
    preferred = result.preferred_tower[eligible]
    count = result.count[eligible]
    margin = preference[preferred, np.arange(preferred.shape[0])]  # the preferred tower's preference, >= 0
    num_eligible = int(eligible.sum())

    # with two towers, tower 1's preference is minus tower 0's: same correlation and coefficient
    contrasts = 1 if num_towers == 2 else num_towers
    half_preference = half_preference[:, :contrasts, eligible]  # [halves, contrasts, eligible types]
    half_preference = half_preference[..., np.isfinite(half_preference[:, 0]).all(axis=0)]  # seen in both halves
    consistency = [_pearson(first, second) for first, second in zip(*half_preference)]
    bimodality = [sarle_bimodality_coefficient(values) for values in preference[:contrasts]]

    top_token_ids, top_preference_nats = [], []
    for tower_idx in range(num_towers):
        prefers_tower = np.flatnonzero(preferred == tower_idx)
        ranked = prefers_tower[np.argsort(-preference[tower_idx, prefers_tower], kind="stable")][:top_k]
        top_token_ids.append(result.token_ids[eligible][ranked].tolist())
        top_preference_nats.append(preference[tower_idx, ranked].tolist())

    return OccurrenceSummary(
        num_towers=num_towers,
        num_predictions=int(result.count.sum()),
        num_token_types=int(result.token_ids.shape[0]),
        num_eligible_types=num_eligible,
        num_excluded_types=int(result.token_ids.shape[0]) - num_eligible,
        min_count=int(min_count),
        alpha=float(alpha),
        global_offset_nats=global_offset.tolist(),
        centered=bool(center),
        type_share_preferring=[_share(preferred == tower_idx, num_eligible) for tower_idx in range(num_towers)],
        occurrence_share_preferring=[
            _share(count[preferred == tower_idx].sum(), count.sum()) for tower_idx in range(num_towers)
        ],
        mean_abs_preference_nats=float(margin.mean()) if num_eligible else None,
        **significance_summary(result.significant, result.preferred_tower, num_towers, num_eligible),
        split_half_consistency=None if None in consistency else float(np.mean(consistency)),
        bimodality_coefficient=None if None in bimodality else float(np.mean(bimodality)),
        top_token_ids=top_token_ids,
        top_preference_nats=top_preference_nats,
    )


def significance_summary(significant, preferred_tower, num_towers, num_eligible):
    """num_significant, significant_share (of eligible types) and num_significant_preferring (one per tower)."""
    return {
        "num_significant": int(significant.sum()),
        "significant_share": _share(significant.sum(), num_eligible),
        "num_significant_preferring": [
            int((significant & (preferred_tower == tower_idx)).sum()) for tower_idx in range(num_towers)
        ],
    }


def _share(part, total):
    """part / total as a float (part may be a boolean mask), or None when total is 0."""
    part = np.sum(part)
    return float(part / total) if total else None


__all__ = [
    "PreferenceAccumulator",
    "PreferenceResult",
    "preferred_tower_test",
    "sarle_bimodality_coefficient",
    "significance_summary",
    "tower_contrast",
    "validate_predictions",
]
