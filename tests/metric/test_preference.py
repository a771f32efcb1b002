"""The tower-preference statistics core: a plain-Python reference, incremental use, planted and null effects."""

import doctest
import itertools
import json
import math
import statistics
from collections import defaultdict

import numpy as np
import pytest
from scipy import special
from scipy import stats

from twotower.evaluation import (
    PreferenceAccumulator,
    ReplicaPreferenceAccumulator,
    compare_preferences,
    compute_preference,
    fit_f_distribution,
)
from twotower.evaluation.tower_preference import comparisons, moderation, preference_stats, replica_preference


ALPHA = 0.05
MIN_COUNT = 5


def synthetic_predictions(rng, num_predictions, vocab_size, planted_nats, num_towers=2, noise=1.0):
    """Token ids [n] (uniform) and log-probs [towers, n]; each type's favourite tower gains planted_nats.

    Returns (token_ids, gold_logprobs, favourite_tower [vocab]). planted_nats = 0 gives towers that differ
    only by noise.
    """
    token_ids = rng.integers(0, vocab_size, num_predictions)
    type_logprob = -rng.uniform(4.0, 8.0, vocab_size)  # far enough below 0 that noise rarely crosses it
    favourite_tower = rng.integers(0, num_towers, vocab_size)
    bonus = planted_nats * (np.arange(num_towers)[:, None] == favourite_tower[None, :])  # [towers, vocab]
    noise = rng.normal(0.0, noise, (num_towers, num_predictions))
    gold_logprobs = type_logprob[token_ids] + bonus[:, token_ids] + noise
    return token_ids, np.minimum(gold_logprobs, 0.0), favourite_tower


def reference_preference(token_ids, gold_logprobs, alpha, min_count):
    """Plain-Python tower preference, one prediction at a time, with scipy's one-sample t-test per type."""
    num_towers = len(gold_logprobs)
    per_type = defaultdict(list)  # token id -> list of per-occurrence log-prob tuples, in stream order
    for position, token_id in enumerate(token_ids):
        per_type[int(token_id)].append([float(gold_logprobs[t][position]) for t in range(num_towers)])

    def contrast(values, t):  # tower t minus the mean of the others
        return values[t] - sum(values[s] for s in range(num_towers) if s != t) / (num_towers - 1)

    rows = {}
    for token_id in sorted(per_type):
        occurrences = per_type[token_id]
        means = [statistics.fmean(o[t] for o in occurrences) for t in range(num_towers)]
        preference = [contrast(means, t) for t in range(num_towers)]
        preferred = max(range(num_towers), key=lambda t: preference[t])
        differences = [contrast(o, preferred) for o in occurrences]
        standard_errors = [
            statistics.stdev([contrast(o, t) for o in occurrences]) / math.sqrt(len(occurrences))
            if len(occurrences) > 1
            else math.nan
            for t in range(num_towers)
        ]
        p_value = stats.ttest_1samp(differences, 0.0).pvalue if len(occurrences) > 1 else math.nan
        if num_towers > 2:
            p_value = min(1.0, p_value * num_towers)
        halves = [occurrences[0::2], occurrences[1::2]]
        half_preference = [
            [contrast([statistics.fmean(o[t] for o in half) for t in range(num_towers)], t) for t in range(num_towers)]
            if half
            else None
            for half in halves
        ]
        rows[token_id] = dict(
            count=len(occurrences),
            mean_logprob=means,
            preference=preference,
            standard_error=standard_errors,
            preferred=preferred,
            p_value=p_value,
            half_preference=half_preference,
        )

    eligible = [token_id for token_id in rows if rows[token_id]["count"] >= min_count]
    # Benjamini-Hochberg step-up: reject the k smallest p-values, k the largest rank with p_(k) <= alpha k / m
    ranked = sorted(eligible, key=lambda token_id: rows[token_id]["p_value"])
    num_rejected = max(
        [rank for rank, token_id in enumerate(ranked, 1) if rows[token_id]["p_value"] <= alpha * rank / len(ranked)],
        default=0,
    )
    significant = set(ranked[:num_rejected])
    consistency = statistics.fmean(
        statistics.correlation(
            [rows[token_id]["half_preference"][0][t] for token_id in eligible],
            [rows[token_id]["half_preference"][1][t] for token_id in eligible],
        )
        for t in range(num_towers)
    )
    bimodality = statistics.fmean(
        sarle_reference([rows[token_id]["preference"][t] for token_id in eligible]) for t in range(num_towers)
    )
    eligible_count = sum(rows[token_id]["count"] for token_id in eligible)
    summary = dict(
        type_share_preferring=[
            sum(rows[token_id]["preferred"] == t for token_id in eligible) / len(eligible) for t in range(num_towers)
        ],
        occurrence_share_preferring=[
            sum(rows[token_id]["count"] for token_id in eligible if rows[token_id]["preferred"] == t) / eligible_count
            for t in range(num_towers)
        ],
        mean_abs_preference_nats=statistics.fmean(
            rows[token_id]["preference"][rows[token_id]["preferred"]] for token_id in eligible
        ),
        num_significant=len(significant),
        split_half_consistency=consistency,
        bimodality_coefficient=bimodality,
    )
    return rows, significant, summary


def sarle_reference(values):
    """Sarle's bimodality coefficient from the textbook formulas for the bias-corrected skewness and kurtosis."""
    n = len(values)
    mean = statistics.fmean(values)
    m2, m3, m4 = (sum((v - mean) ** k for v in values) / n for k in (2, 3, 4))
    skewness = math.sqrt(n * (n - 1)) / (n - 2) * m3 / m2**1.5
    excess_kurtosis = (n - 1) / ((n - 2) * (n - 3)) * ((n + 1) * (m4 / m2**2 - 3) + 6)
    return (skewness**2 + 1) / (excess_kurtosis + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))


def assert_summaries_close(summary, expected):
    assert summary.keys() == expected.keys()
    for key, value in expected.items():
        if key.startswith("top_"):  # one list per tower, of different lengths
            for tower_values, expected_values in zip(summary[key], value):
                np.testing.assert_allclose(tower_values, expected_values, rtol=1e-12, err_msg=key)
        else:
            np.testing.assert_allclose(summary[key], value, rtol=1e-12, err_msg=key)


@pytest.mark.parametrize("num_towers", [2, 3], ids=["towers2", "towers3"])
def test_matches_plain_python_reference(num_towers):
    rng = np.random.default_rng(num_towers)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 600, 23, planted_nats=0.7, num_towers=num_towers)
    result = compute_preference(token_ids, gold_logprobs, alpha=ALPHA, min_count=MIN_COUNT, top_k=3)
    rows, significant, summary = reference_preference(token_ids, gold_logprobs, ALPHA, MIN_COUNT)

    assert result.token_ids.tolist() == sorted(rows)
    column = {key: [rows[token_id][key] for token_id in sorted(rows)] for key in next(iter(rows.values()))}
    np.testing.assert_array_equal(result.count, column["count"])
    np.testing.assert_allclose(result.mean_logprob.T, column["mean_logprob"], rtol=1e-12)
    np.testing.assert_allclose(result.preference_nats.T, column["preference"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result.standard_error.T, column["standard_error"], rtol=1e-9)
    np.testing.assert_array_equal(result.preferred_tower, column["preferred"])
    np.testing.assert_allclose(result.p_value, column["p_value"], rtol=1e-7)
    assert set(result.token_ids[result.significant].tolist()) == significant
    assert result.summary["num_significant"] == summary.pop("num_significant")
    for key, expected in summary.items():
        np.testing.assert_allclose(result.summary[key], expected, rtol=1e-9, err_msg=key)
    # the top tokens of each tower are its most preferred eligible types, strongest first
    for tower_idx, top_ids in enumerate(result.summary["top_token_ids"]):
        candidates = [t for t in rows if rows[t]["count"] >= MIN_COUNT and rows[t]["preferred"] == tower_idx]
        expected = sorted(candidates, key=lambda t: -rows[t]["preference"][tower_idx])[:3]
        assert top_ids == expected


def test_incremental_updates_equal_one_shot(monkeypatch):
    rng = np.random.default_rng(0)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 5000, 50, planted_nats=0.5)

    # uneven batches whose ids first stay below 10 (so the arrays must grow later), and tiny internal chunks
    monkeypatch.setattr(preference_stats, "CHUNK_SIZE", 7)
    order = np.argsort(token_ids >= 10, kind="stable")
    token_ids, gold_logprobs = token_ids[order], gold_logprobs[:, order]
    one_shot = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT)
    accumulator = PreferenceAccumulator()
    for start, end in zip([0, 1, 100, 1234, 4000], [1, 100, 1234, 4000, 5000]):
        accumulator.update(token_ids[start:end], gold_logprobs[:, start:end])
    incremental = accumulator.compute(min_count=MIN_COUNT)

    for name in ("token_ids", "count", "mean_logprob", "preference_nats", "standard_error", "p_value", "significant"):
        np.testing.assert_allclose(getattr(incremental, name), getattr(one_shot, name), rtol=1e-12, err_msg=name)
    assert_summaries_close(incremental.summary, one_shot.summary)


def test_merged_accumulators_equal_one_accumulator():
    rng = np.random.default_rng(1)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 3000, 40, planted_nats=0.5)
    one_shot = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT)
    first, second = PreferenceAccumulator(), PreferenceAccumulator()
    first.update(token_ids[:1000] % 20, gold_logprobs[:, :1000])  # smaller ids: merge must grow `first`
    second.update(token_ids[1000:], gold_logprobs[:, 1000:])
    whole = PreferenceAccumulator()
    whole.update(np.concatenate([token_ids[:1000] % 20, token_ids[1000:]]), gold_logprobs)
    merged = first.merge(second).compute(min_count=MIN_COUNT)
    expected = whole.compute(min_count=MIN_COUNT)

    assert one_shot.token_ids.shape == merged.token_ids.shape
    # totals per type do not depend on how the stream was split; the halves may (each accumulator interleaves its own)
    for name in ("count", "mean_logprob", "preference_nats", "standard_error", "p_value", "significant"):
        np.testing.assert_allclose(getattr(merged, name), getattr(expected, name), rtol=1e-12, err_msg=name)
    assert merged.summary["num_predictions"] == 3000


def test_planted_preferences_are_recovered():
    rng = np.random.default_rng(2)
    token_ids, gold_logprobs, favourite = synthetic_predictions(rng, 60_000, 300, planted_nats=1.0)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT)
    summary = result.summary

    planted_sign = np.where(favourite[result.token_ids] == 0, 1.0, -1.0)
    np.testing.assert_array_equal(np.sign(result.preference_nats[0]), planted_sign)
    np.testing.assert_allclose(np.abs(result.preference_nats[0]), 1.0, atol=0.5)
    assert result.significant.all()
    assert summary["split_half_consistency"] > 0.95
    assert summary["bimodality_coefficient"] > 5 / 9  # two groups of tokens, at +1 and -1 nat
    assert summary["type_share_preferring"][0] == pytest.approx(np.mean(favourite[result.token_ids] == 0))
    assert summary["mean_abs_preference_nats"] == pytest.approx(1.0, abs=0.05)
    # the top tokens of tower 0 are types planted for tower 0
    assert all(favourite[token_id] == 0 for token_id in summary["top_token_ids"][0])


def test_planted_preferences_with_three_towers():
    rng = np.random.default_rng(3)
    token_ids, gold_logprobs, favourite = synthetic_predictions(rng, 60_000, 150, planted_nats=1.5, num_towers=3)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT)

    np.testing.assert_array_equal(result.preferred_tower, favourite[result.token_ids])
    # the favourite gains 1.5 nats over each other tower, so 1.5 over their mean; each of the others loses 0.75
    np.testing.assert_allclose(result.preference_nats.max(axis=0), 1.5, atol=0.5)
    assert result.significant.all()
    assert result.summary["split_half_consistency"] > 0.9
    assert sum(result.summary["type_share_preferring"]) == pytest.approx(1.0)


def test_null_towers_give_no_consistency_and_nominal_false_positives():
    rng = np.random.default_rng(4)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 100_000, 1000, planted_nats=0.0)
    result = compute_preference(token_ids, gold_logprobs, alpha=ALPHA, min_count=MIN_COUNT)
    summary = result.summary

    assert abs(summary["split_half_consistency"]) < 0.1
    # uncorrected p-values are uniform under the null: about alpha of the types fall below alpha...
    assert np.mean(result.p_value[result.eligible] < ALPHA) == pytest.approx(ALPHA, abs=0.02)
    # ...and Benjamini-Hochberg keeps the share of (here all false) discoveries at or below alpha
    assert summary["significant_share"] <= ALPHA
    assert summary["bimodality_coefficient"] < 5 / 9
    assert summary["type_share_preferring"][0] == pytest.approx(0.5, abs=0.06)


def shifted_predictions(rng, num_predictions, vocab_size, shift_nats, spread_nats=0.15, noise=0.3):
    """Token ids [n] and two towers' log-probs [2, n]: per-type preferences drawn around zero, plus shift_nats
    for tower 0 on every prediction (tower 0 better overall). Returns (token_ids, gold_logprobs, planted [vocab]).
    """
    token_ids = rng.integers(0, vocab_size, num_predictions)
    type_logprob = -rng.uniform(4.0, 8.0, vocab_size)
    planted = rng.normal(0.0, spread_nats, vocab_size)  # tower 0 minus tower 1, before the shift
    half_gap = (planted[token_ids] + shift_nats) / 2
    gold_logprobs = type_logprob[token_ids] + np.stack([half_gap, -half_gap])
    gold_logprobs += rng.normal(0.0, noise, gold_logprobs.shape)
    return token_ids, np.minimum(gold_logprobs, 0.0), planted


def test_centering_removes_a_planted_global_offset():
    rng = np.random.default_rng(9)
    token_ids, gold_logprobs, planted = shifted_predictions(rng, 40_000, 200, shift_nats=0.3)
    raw = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT)
    centered = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, center=True)

    # the better tower wins almost every type until its overall advantage is taken out
    assert raw.summary["type_share_preferring"][0] > 0.95
    assert centered.summary["type_share_preferring"][0] == pytest.approx(0.5, abs=0.1)
    planted = planted[centered.token_ids]
    assert np.corrcoef(centered.preference_nats[0], planted)[0, 1] > 0.95
    large = np.abs(planted) > 0.2
    assert large.sum() > 10
    np.testing.assert_array_equal(centered.preferred_tower[large], np.where(planted[large] > 0, 0, 1))

    # the offset is the difference of the towers' mean log-probs over all predictions
    mean_difference = gold_logprobs[0].mean() - gold_logprobs[1].mean()
    assert mean_difference == pytest.approx(0.3, abs=0.02)
    offset = np.array([mean_difference, -mean_difference])
    for result in (raw, centered):
        np.testing.assert_allclose(result.summary["global_offset_nats"], offset, atol=1e-12)
    assert (raw.summary["centered"], centered.summary["centered"]) == (False, True)
    np.testing.assert_allclose(centered.preference_nats, raw.preference_nats - offset[:, None], atol=1e-12)
    np.testing.assert_array_equal(centered.mean_logprob, raw.mean_logprob)
    np.testing.assert_array_equal(centered.standard_error, raw.standard_error)
    # a correlation ignores a shift shared by both halves
    assert centered.summary["split_half_consistency"] == pytest.approx(raw.summary["split_half_consistency"], rel=1e-12)


@pytest.mark.parametrize("num_towers", [2, 3], ids=["towers2", "towers3"])
def test_centered_p_values_match_a_t_test_against_the_offset(num_towers):
    rng = np.random.default_rng(10 + num_towers)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 1500, 15, planted_nats=0.4, num_towers=num_towers)
    gold_logprobs[0] -= 0.2  # tower 0's probe worse overall
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, center=True)

    # per-occurrence preference: each tower minus the mean of the others, and its mean over all predictions
    others = (gold_logprobs.sum(axis=0) - gold_logprobs) / (num_towers - 1)
    occurrence_preference = gold_logprobs - others  # [towers, n]
    offset = occurrence_preference.mean(axis=1)
    np.testing.assert_allclose(result.summary["global_offset_nats"], offset, atol=1e-12)
    for column, token_id in enumerate(result.token_ids):
        centered = occurrence_preference[:, token_ids == token_id] - offset[:, None]  # [towers, count]
        preferred = int(np.argmax(centered.mean(axis=1)))
        p_value = min(1.0, stats.ttest_1samp(centered[preferred], 0.0).pvalue * (num_towers if num_towers > 2 else 1))
        assert result.preferred_tower[column] == preferred
        np.testing.assert_allclose(result.preference_nats[:, column], centered.mean(axis=1), atol=1e-12)
        assert result.p_value[column] == pytest.approx(p_value, rel=1e-7)


def test_swapping_towers_flips_the_preference():
    rng = np.random.default_rng(5)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 2000, 30, planted_nats=0.5)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT)
    swapped = compute_preference(token_ids, gold_logprobs[::-1], min_count=MIN_COUNT)

    np.testing.assert_allclose(swapped.preference_nats, result.preference_nats[::-1], rtol=1e-12)
    np.testing.assert_allclose(swapped.p_value, result.p_value, rtol=1e-12)
    assert swapped.summary["top_token_ids"] == result.summary["top_token_ids"][::-1]
    assert swapped.summary["split_half_consistency"] == pytest.approx(result.summary["split_half_consistency"])


def test_float32_inputs_and_fixed_vocab_size():
    rng = np.random.default_rng(6)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 2000, 30, planted_nats=0.5)
    gold_logprobs = gold_logprobs.astype(np.float32)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, vocab_size=30)
    expected = compute_preference(token_ids, gold_logprobs.astype(np.float64), min_count=MIN_COUNT)
    np.testing.assert_allclose(result.preference_nats, expected.preference_nats, rtol=1e-12)
    with pytest.raises(ValueError, match="must be < vocab_size=20"):
        compute_preference(token_ids, gold_logprobs, vocab_size=20)


def test_single_occurrence_types_have_no_standard_error():
    result = compute_preference([1, 1, 1, 2], [[-1.0, -1.5, -1.2, -2.0], [-2.0, -2.0, -2.5, -1.0]], min_count=2)
    assert np.isnan(result.standard_error[:, 1]).all() and np.isnan(result.p_value[1])
    assert result.eligible.tolist() == [True, False]
    as_dict = result.to_dict()
    assert as_dict["p_value"][1] is None and as_dict["standard_error"][0][1] is None
    assert as_dict["num_excluded_types"] == 1


@pytest.mark.parametrize(
    "token_ids, gold_logprobs, message",
    [
        ([1, 2, 3], [[-1.0, -1.0], [-1.0, -1.0]], "token_ids has 3 predictions but gold_logprobs has 2"),
        ([1, 2], [[-1.0, np.nan], [-1.0, -1.0]], "must be finite; got nan at tower 0, prediction 1"),
        ([1, 2], [[-1.0, -1.0], [-np.inf, -1.0]], "must be finite; got -inf at tower 1, prediction 0"),
        ([1, 2], [[-1.0, 0.5], [-1.0, -1.0]], r"must be log-probabilities \(<= 0\); got 0.5"),
        ([1, 2], [[-1.0, -1.0]], "1 tower row"),
        ([], [[], []], "token_ids is empty"),
        ([1, -100], [[-1.0, -1.0], [-1.0, -1.0]], "must be >= 0; got -100 at prediction 1"),
        ([1.0, 2.0], [[-1.0, -1.0], [-1.0, -1.0]], "must be integers"),
        ([1, 2], [-1.0, -1.0], "must be 2-D"),
    ],
    ids=["lengths", "nan", "inf", "positive", "one-tower", "empty", "negative-id", "float-ids", "1-D"],
)
def test_bad_input_raises_a_clear_error(token_ids, gold_logprobs, message):
    with pytest.raises(ValueError, match=message):
        PreferenceAccumulator().update(token_ids, gold_logprobs)


def test_bad_options_and_mismatched_updates_raise():
    accumulator = PreferenceAccumulator()
    with pytest.raises(ValueError, match="no predictions"):
        accumulator.compute()
    accumulator.update([1, 1], [[-1.0, -2.0], [-1.5, -1.0]])
    with pytest.raises(ValueError, match="holds 2"):
        accumulator.update([1], [[-1.0], [-1.0], [-1.0]])
    with pytest.raises(ValueError, match="cannot merge"):
        accumulator.merge(PreferenceAccumulator(num_towers=3))
    for options, message in [({"alpha": 1.5}, "alpha"), ({"min_count": 1}, "min_count"), ({"top_k": -1}, "top_k")]:
        with pytest.raises(ValueError, match=message):
            accumulator.compute(**options)


def test_compare_preferences_matches_towers():
    rng = np.random.default_rng(7)
    token_ids, gold_logprobs, _ = synthetic_predictions(rng, 20_000, 200, planted_nats=1.0)
    first = compute_preference(token_ids[:10_000], gold_logprobs[:, :10_000], min_count=MIN_COUNT)
    # a second "run" over other occurrences, with its tower labels swapped
    second = compute_preference(token_ids[10_000:], gold_logprobs[::-1, 10_000:], min_count=MIN_COUNT)

    comparison = compare_preferences(first.token_ids, first.preference_nats, second.token_ids, second.preference_nats)
    assert comparison["tower_mapping"] == [1, 0]
    assert comparison["correlation"] > 0.95
    raw = np.corrcoef(first.preference_nats[0], second.preference_nats[0])[0, 1]
    assert comparison["correlation"] == pytest.approx(-raw)
    assert comparison["num_shared_types"] == 200


def test_compare_preferences_finds_the_best_permutation_of_three_towers():
    rng = np.random.default_rng(8)
    preference = rng.normal(size=(3, 50))
    permutation = [2, 0, 1]  # run b's tower permutation[i] is run a's tower i
    other = np.empty_like(preference)
    other[permutation] = preference + rng.normal(scale=0.1, size=preference.shape)
    comparison = compare_preferences(np.arange(50), preference, np.arange(50)[::-1], other[:, ::-1])
    assert comparison["tower_mapping"] == permutation
    assert comparison["correlation"] > 0.95


def test_compare_preferences_rejects_incomparable_runs():
    with pytest.raises(ValueError, match="2 towers but run b has 3"):
        compare_preferences([1, 2, 3], np.zeros((2, 3)) + [1, 2, 3], [1, 2, 3], np.zeros((3, 3)) + [1, 2, 3])
    with pytest.raises(ValueError, match="share 2 token types"):
        compare_preferences([1, 2, 3], [[1.0, 2.0, 3.0]] * 2, [2, 3, 4], [[1.0, 2.0, 3.0]] * 2)


@pytest.mark.parametrize("module", [preference_stats, replica_preference, comparisons], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    failures, attempted = doctest.testmod(module)
    assert attempted > 0 and failures == 0


# Several probe replicas per tower: the replica-level test


def replica_predictions(
    rng, num_types, replicas, tower_effect, replica_bias, run_bias=0.0, noise=0.3, num_towers=2, min_occurrences=30
):
    """Token ids [n] and log-probs [probes, n] of `replicas` probes per tower (tower-major), with planted parts.

    Every occurrence has a difficulty shared by all probes; probe p adds tower_effect[tower, type] (nats),
    its own fixed per-type bias ~ N(0, replica_bias^2), a per-type bias ~ N(0, run_bias^2) shared by the
    probes of its run (replica r of every tower is run r), and per-occurrence noise ~ N(0, noise^2).
    Returns (token_ids, gold_logprobs, probe_towers, probe_runs).
    """
    counts = rng.integers(min_occurrences, 2 * min_occurrences + 1, num_types)
    token_ids = rng.permutation(np.repeat(np.arange(num_types), counts))
    difficulty = -rng.uniform(4.0, 8.0, num_types)[token_ids] + rng.normal(0.0, 1.0, token_ids.shape[0])  # [n]
    probe_towers = np.repeat(np.arange(num_towers), replicas)
    probe_runs = np.tile(np.arange(replicas), num_towers)
    bias = rng.normal(0.0, replica_bias, (probe_towers.shape[0], num_types))  # [probes, types]
    bias += rng.normal(0.0, run_bias, (replicas, num_types))[probe_runs]
    per_type = np.asarray(tower_effect)[probe_towers] + bias
    occurrence_noise = rng.normal(0.0, noise, (probe_towers.shape[0], token_ids.shape[0]))
    gold_logprobs = difficulty + per_type[:, token_ids] + occurrence_noise
    return token_ids, np.minimum(gold_logprobs, 0.0), probe_towers.tolist(), probe_runs.tolist()


def two_tower_effect(rng, num_types, nats, jitter=0.05):
    """[towers, types]: tower 0 minus tower 1 is a random sign times `nats`, plus a little jitter."""
    effect = rng.choice([-nats, nats], num_types) + rng.normal(0.0, jitter, num_types)
    return np.stack([effect / 2, -effect / 2])


def test_probe_noise_alone_is_flagged_by_the_occurrence_test_but_not_by_the_replica_test():
    rng = np.random.default_rng(20)
    # 1000 types: the reliability of pure noise then scatters by about 0.05 around 0
    token_ids, gold_logprobs, probe_towers, _ = replica_predictions(rng, 1000, 3, np.zeros((2, 1000)), replica_bias=0.3)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers)
    summary = result.summary

    assert summary["test"] == "replica" and not summary["paired"] and summary["replicas_per_tower"] == [3, 3]
    assert summary["occurrence_significant_share"] >= 0.5  # each probe's own bias passes for a tower preference
    assert summary["significant_share"] <= 0.1
    # the replica-level p-values are calibrated: about alpha of them fall below alpha
    assert np.mean(result.p_value[result.eligible] < ALPHA) == pytest.approx(ALPHA, abs=0.02)
    assert abs(summary["reliability"]) < 0.15
    low, high = summary["reliability_ci"]
    assert low < 0.0 < high
    # probes of two towers differ as much as probes of one tower
    assert summary["two_tower_difference_nats"] == pytest.approx(summary["same_tower_floor_nats"], rel=0.1)


def test_a_planted_tower_effect_is_found_beyond_probe_noise():
    rng = np.random.default_rng(21)
    effect = two_tower_effect(rng, 200, 0.5)
    token_ids, gold_logprobs, probe_towers, _ = replica_predictions(rng, 200, 3, effect, replica_bias=0.1)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers)
    summary = result.summary

    assert summary["significant_share"] >= 0.6 and summary["reliability"] >= 0.7
    low, high = summary["reliability_ci"]
    assert 0.7 < low <= summary["reliability"] <= high < 1.0
    planted_sign = np.sign(effect[0] - effect[1])
    significant = result.significant
    np.testing.assert_array_equal(np.sign(result.preference_nats[0, significant]), planted_sign[significant])
    assert summary["two_tower_difference_nats"] > 3 * summary["same_tower_floor_nats"]


def test_pairing_by_run_cancels_the_noise_probes_of_one_run_share():
    rng = np.random.default_rng(22)
    # the probes of one run share most of their per-type error (a real model: r = 0.87 between the towers)
    effect = two_tower_effect(rng, 200, 0.3)
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(
        rng, 200, 3, effect, replica_bias=0.1, run_bias=0.3
    )
    paired = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs
    )
    unpaired = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers)

    assert paired.summary["paired"] and paired.summary["probe_runs"] == probe_runs
    assert paired.summary["residual_df"] == 2 and unpaired.summary["residual_df"] == 4
    assert paired.summary["significant_share"] >= 0.6 and unpaired.summary["significant_share"] <= 0.2
    assert paired.summary["reliability"] >= 0.8 and unpaired.summary["reliability"] <= 0.5
    np.testing.assert_allclose(paired.preference_nats, unpaired.preference_nats, atol=1e-12)  # same estimate


def few_eligible_predictions(rng, probe_towers, probe_runs):
    """Log-probs where only 2 types reach MIN_COUNT: fewer than 3 variances, so no moderation (prior df 0)."""
    counts = np.array([20, 20, 3, 3, 3, 4, 2, 3])
    token_ids = np.repeat(np.arange(counts.shape[0]), counts)
    num_probes = len(probe_towers)
    per_type = rng.normal(0.0, 0.4, (num_probes, counts.shape[0]))
    if probe_runs is not None:
        per_type += rng.normal(0.0, 0.4, (max(probe_runs) + 1, counts.shape[0]))[probe_runs]
    gold_logprobs = -5.0 + per_type[:, token_ids] + rng.normal(0.0, 0.3, (num_probes, token_ids.shape[0]))
    return token_ids, gold_logprobs


def test_paired_p_values_without_moderation_are_one_sample_t_tests_over_runs():
    rng = np.random.default_rng(23)
    probe_towers, probe_runs = [1, 0, 0, 1, 0, 1, 1, 0], [0, 0, 1, 1, 2, 2, 3, 3]  # any order of probes
    token_ids, gold_logprobs = few_eligible_predictions(rng, probe_towers, probe_runs)
    result = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs
    )
    assert result.summary["prior_df"] == 0.0 and result.summary["prior_variance"] is None

    towers, runs = np.array(probe_towers), np.array(probe_runs)
    for column, token_id in enumerate(result.token_ids):
        probe_mean = gold_logprobs[:, token_ids == token_id].mean(axis=1)  # [probes]
        run_difference = [
            probe_mean[(runs == run) & (towers == 0)] - probe_mean[(runs == run) & (towers == 1)] for run in range(4)
        ]
        expected = stats.ttest_1samp(np.concatenate(run_difference), 0.0)
        assert result.p_value[column] == pytest.approx(expected.pvalue, rel=1e-9)
        assert result.preference_nats[0, column] == pytest.approx(np.mean(run_difference), abs=1e-12)
        np.testing.assert_allclose(result.probe_mean_logprob[:, column], probe_mean, rtol=1e-12)


def test_unpaired_p_values_without_moderation_are_pooled_two_sample_t_tests():
    rng = np.random.default_rng(24)
    probe_towers = [0, 0, 0, 1, 1]  # unequal replica counts
    token_ids, gold_logprobs = few_eligible_predictions(rng, probe_towers, None)
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers)
    assert result.summary["prior_df"] == 0.0 and result.summary["residual_df"] == 3

    towers = np.array(probe_towers)
    for column, token_id in enumerate(result.token_ids):
        probe_mean = gold_logprobs[:, token_ids == token_id].mean(axis=1)
        expected = stats.ttest_ind(probe_mean[towers == 0], probe_mean[towers == 1], equal_var=True)
        assert result.p_value[column] == pytest.approx(expected.pvalue, rel=1e-9)
        assert abs(result.preference_nats[0, column] / result.standard_error[0, column]) == pytest.approx(
            abs(expected.statistic), rel=1e-9
        )


def test_moderated_t_equals_a_hand_computation():
    rng = np.random.default_rng(25)
    effect = two_tower_effect(rng, 150, 0.2)
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(
        rng, 150, 3, effect, replica_bias=0.1, run_bias=0.2, min_occurrences=8
    )
    gold_logprobs[:, np.isin(token_ids, np.arange(0, 150, 3))] *= 1.5  # replica noise that varies between types
    result = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs
    )
    prior_df, prior_variance = result.summary["prior_df"], result.summary["prior_variance"]
    assert 0.0 < prior_df < 100.0  # a finite prior: the moderation is neither off nor complete

    contrast = result.probe_mean_logprob[:3] - result.probe_mean_logprob[3:]  # [runs, types]: runs pair replica r
    residual_variance = contrast.var(axis=0, ddof=1)
    posterior_variance = (prior_df * prior_variance + 2 * residual_variance) / (prior_df + 2)
    t_statistic = contrast.mean(axis=0) / np.sqrt(posterior_variance / 3)
    np.testing.assert_allclose(result.standard_error[0], np.sqrt(posterior_variance / 3), rtol=1e-9)
    np.testing.assert_allclose(result.p_value, 2 * stats.t.sf(np.abs(t_statistic), 2 + prior_df), rtol=1e-7)
    expected_significant = stats.false_discovery_control(result.p_value[result.eligible]) <= ALPHA
    np.testing.assert_array_equal(result.significant[result.eligible], expected_significant)


@pytest.mark.parametrize(
    "prior_df, prior_variance, residual_df", [(5.0, 0.04, 3), (12.0, 2.0, 4), (3.0, 0.5, 2)], ids=["d5", "d12", "d3"]
)
def test_f_distribution_fit_recovers_a_planted_prior(prior_df, prior_variance, residual_df):
    rng = np.random.default_rng(26)
    true_variance = prior_variance * prior_df / rng.chisquare(prior_df, 20_000)  # scaled inverse chi-square prior
    residual_variance = true_variance * rng.chisquare(residual_df, 20_000) / residual_df
    fitted_df, fitted_variance = fit_f_distribution(residual_variance, residual_df)
    assert fitted_df == pytest.approx(prior_df, rel=0.15)
    assert fitted_variance == pytest.approx(prior_variance, rel=0.05)


def test_f_distribution_fit_of_equal_true_variances_and_of_too_few():
    rng = np.random.default_rng(27)
    residual_variance = 0.3 * rng.chisquare(4, 5000) / 4  # nothing varies beyond the chi-square itself
    prior_df, prior_variance = fit_f_distribution(residual_variance, 4)
    assert prior_df == math.inf and prior_variance == pytest.approx(0.3, rel=0.05)
    assert fit_f_distribution([0.0, 0.2, 0.0, 0.3], 4)[0] == 0.0  # zero variances are left out
    for value in (0.01, 1.0, 30.0):
        assert moderation.trigamma_inverse(float(special.polygamma(1, value))) == pytest.approx(value, rel=1e-8)


def test_reliability_matches_the_planted_variance_components():
    rng = np.random.default_rng(28)
    tower_sd, replica_sd, noise, replicas, num_types = 0.3, 0.3, 0.3, 3, 1000
    planted = rng.normal(0.0, tower_sd, num_types)  # tower 0 minus tower 1
    token_ids, gold_logprobs, probe_towers, _ = replica_predictions(
        rng, num_types, replicas, np.stack([planted / 2, -planted / 2]), replica_bias=replica_sd, noise=noise,
        min_occurrences=10,
    )
    result = compute_preference(token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers)
    summary = result.summary

    # one probe's per-type mean varies by its bias and its occurrences' noise; a tower's mean over 3 by a third of it
    count = np.bincount(token_ids)
    probe_variance = replica_sd**2 + noise**2 * np.mean(1.0 / count)
    expected = tower_sd**2 / (tower_sd**2 + 2 * probe_variance / replicas)
    expected_single_probe = tower_sd**2 / (tower_sd**2 + 2 * probe_variance)
    assert summary["reliability"] == pytest.approx(expected, abs=0.05)
    low, high = summary["reliability_ci"]
    assert low < expected < high and high - low < 0.15
    assert summary["reliability_single_probe"] == pytest.approx(expected_single_probe, abs=0.05)
    reliability = summary["reliability"]
    assert summary["reliability_single_probe"] == pytest.approx(reliability / (replicas - (replicas - 1) * reliability))


def test_floor_arrays_are_mean_absolute_differences_of_probe_pairs():
    rng = np.random.default_rng(29)
    effect = two_tower_effect(rng, 40, 0.4)
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(
        rng, 40, 3, effect, replica_bias=0.2, min_occurrences=6
    )
    for runs in (probe_runs, None):
        result = compute_preference(
            token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=runs
        )
        per_type = [gold_logprobs[:, token_ids == token_id].mean(axis=1) for token_id in result.token_ids]
        probe_mean = np.stack(per_type, axis=1)  # [probes, types]
        two_tower, same_tower = [], []
        for first, second in itertools.combinations(range(6), 2):
            difference = np.abs(probe_mean[first] - probe_mean[second])
            if probe_towers[first] == probe_towers[second]:
                same_tower.append(difference)
            elif runs is None or runs[first] != runs[second]:
                two_tower.append(difference)
        assert (len(two_tower), len(same_tower)) == ((6 if runs else 9), 6)
        np.testing.assert_allclose(result.two_tower_difference_per_type_nats, np.mean(two_tower, axis=0), rtol=1e-9)
        np.testing.assert_allclose(result.same_tower_difference_per_type_nats, np.mean(same_tower, axis=0), rtol=1e-9)
        eligible = result.eligible
        assert result.summary["same_tower_floor_nats"] == pytest.approx(np.mean(same_tower, axis=0)[eligible].mean())
        assert result.summary["two_tower_difference_nats"] == pytest.approx(np.mean(two_tower, axis=0)[eligible].mean())


def test_centering_takes_out_each_probes_overall_offset():
    rng = np.random.default_rng(30)
    effect = two_tower_effect(rng, 100, 0.4)
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(rng, 100, 3, effect, replica_bias=0.15)
    offsets = np.array([[0.0], [-0.4], [-0.1], [-0.3], [0.0], [-0.2]])  # some probes trained less well than others
    options = dict(min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs, center=True)
    centered = compute_preference(token_ids, gold_logprobs, **options)
    shifted = compute_preference(token_ids, gold_logprobs + offsets, **options)
    raw = compute_preference(token_ids, gold_logprobs + offsets, **{**options, "center": False})

    # centered results do not see a probe's overall offset
    names = ("preference_nats", "standard_error", "p_value", "two_tower_difference_per_type_nats",
             "same_tower_difference_per_type_nats")
    for name in names:
        np.testing.assert_allclose(getattr(shifted, name), getattr(centered, name), rtol=1e-7, atol=1e-10, err_msg=name)
    assert shifted.summary["reliability"] == pytest.approx(centered.summary["reliability"], rel=1e-7)
    # the preference is the raw one minus the global offset; raw same-tower differences carry the offsets
    offset = np.array(raw.summary["global_offset_nats"])
    np.testing.assert_allclose(shifted.preference_nats, raw.preference_nats - offset[:, None], atol=1e-10)
    np.testing.assert_allclose(shifted.summary["global_offset_nats"], offset, atol=1e-12)
    np.testing.assert_array_equal(shifted.probe_mean_logprob, raw.probe_mean_logprob)
    assert raw.summary["same_tower_floor_nats"] > shifted.summary["same_tower_floor_nats"] + 0.05


def test_replica_accumulator_incremental_and_merged_equal_one_shot(monkeypatch):
    rng = np.random.default_rng(31)
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(
        rng, 60, 2, two_tower_effect(rng, 60, 0.3), replica_bias=0.1
    )
    order = np.argsort(token_ids >= 10, kind="stable")  # small ids first, so the arrays must grow later
    token_ids, gold_logprobs = token_ids[order], gold_logprobs[:, order].astype(np.float32)
    one_shot = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs
    )

    monkeypatch.setattr(preference_stats, "CHUNK_SIZE", 7)
    incremental = ReplicaPreferenceAccumulator(probe_towers, probe_runs)
    parts = [ReplicaPreferenceAccumulator(probe_towers, probe_runs) for _ in range(2)]
    bounds = [0, 1, 100, 1234, token_ids.shape[0]]
    for index, (start, end) in enumerate(zip(bounds, bounds[1:])):
        incremental.update(token_ids[start:end], gold_logprobs[:, start:end])
        parts[index % 2].update(token_ids[start:end], gold_logprobs[:, start:end])
    merged = parts[1].merge(parts[0])
    assert incremental.num_predictions == merged.num_predictions == token_ids.shape[0]

    names = ("count", "mean_logprob", "preference_nats", "standard_error", "p_value", "significant",
             "probe_mean_logprob", "two_tower_difference_per_type_nats", "same_tower_difference_per_type_nats",
             "occurrence_standard_error")
    for other in (incremental.compute(min_count=MIN_COUNT), merged.compute(min_count=MIN_COUNT)):
        for name in names:
            np.testing.assert_allclose(getattr(other, name), getattr(one_shot, name), rtol=1e-9, err_msg=name)
        for key in ("reliability", "reliability_single_probe", "prior_variance", "two_tower_difference_nats"):
            assert other.summary[key] == pytest.approx(one_shot.summary[key], rel=1e-9)


def test_three_towers_with_paired_replicas():
    rng = np.random.default_rng(32)
    num_types = 120
    favourite = rng.integers(0, 3, num_types)
    effect = 0.6 * (np.arange(3)[:, None] == favourite)  # [towers, types]
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(
        rng, num_types, 3, effect, replica_bias=0.1, run_bias=0.2, num_towers=3
    )
    result = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs
    )
    summary = result.summary

    np.testing.assert_array_equal(result.preferred_tower, favourite[result.token_ids])
    assert result.standard_error.shape == (3, num_types) and result.probe_mean_logprob.shape == (9, num_types)
    assert summary["significant_share"] >= 0.8 and summary["reliability"] >= 0.8
    assert summary["replicas_per_tower"] == [3, 3, 3] and summary["num_probes"] == 9
    assert sum(summary["num_significant_preferring"]) == summary["num_significant"]
    # the preferred tower's p-value is Bonferroni-corrected for the choice among 3 towers, as the occurrence test's
    preferred = (result.preferred_tower, np.arange(num_types))
    t_statistic = result.preference_nats[preferred] / result.standard_error[preferred]
    degrees = summary["residual_df"] + (summary["prior_df"] if summary["prior_df"] is not None else np.inf)
    np.testing.assert_allclose(result.p_value, np.minimum(1.0, 3 * 2 * stats.t.sf(t_statistic, degrees)), rtol=1e-7)


def test_replica_result_is_json_ready_and_the_plain_result_unchanged():
    rng = np.random.default_rng(33)
    token_ids, gold_logprobs, probe_towers, probe_runs = replica_predictions(
        rng, 30, 2, two_tower_effect(rng, 30, 0.3), replica_bias=0.1, min_occurrences=3
    )
    replica = compute_preference(
        token_ids, gold_logprobs, min_count=MIN_COUNT, probe_towers=probe_towers, probe_runs=probe_runs
    )
    as_dict = json.loads(json.dumps(replica.to_dict(), allow_nan=False))
    for name in preference_stats.REPLICA_FIELDS:
        assert np.shape(as_dict[name]) == getattr(replica, name).shape
    # the summary survives beside the per-type arrays (its floor means and theirs have distinct names)
    assert {key: as_dict[key] for key in replica.summary} == replica.summary
    assert as_dict["occurrence_num_significant"] == int(replica.occurrence_significant.sum())

    # the occurrence-level part is the plain test on the towers' replica means
    tower_mean = np.stack([gold_logprobs[:2].mean(axis=0), gold_logprobs[2:].mean(axis=0)])  # tower-major probes
    plain = compute_preference(token_ids, tower_mean, min_count=MIN_COUNT)
    np.testing.assert_allclose(replica.occurrence_p_value, plain.p_value, rtol=1e-9)
    np.testing.assert_allclose(replica.preference_nats, plain.preference_nats, atol=1e-12)
    assert replica.summary["split_half_consistency"] == pytest.approx(plain.summary["split_half_consistency"])
    assert plain.summary.keys() <= replica.summary.keys()
    assert "test" not in plain.summary and not set(preference_stats.REPLICA_FIELDS) & plain.to_dict().keys()


@pytest.mark.parametrize(
    "probe_towers, probe_runs, num_rows, message",
    [
        ([0, 0, 1], None, 3, r"at least 2 probe replicas per tower; got probe_towers=\[0, 0, 1\]"),
        ([0, 0, 2, 2], None, 4, "must name towers 0, 1, ..., num_towers - 1"),
        ([0, 0], None, 2, "must name towers 0, 1"),
        ([0, 0, 1, 1], None, 3, "gold_logprobs has 3 probe rows but probe_towers names 4 probes"),
        ([0, 0, 1, 1], [0, 1, 0], 4, "probe_runs must hold one int per probe"),
        ([0, 0, 1, 1], [0, 0, 1, 1], 4, r"run 0 holds probes of towers \[0, 0\].*Drop probe_runs"),
        ([0, 0, 1, 1, 1], [0, 1, 0, 1, 2], 5, r"run 2 holds probes of towers \[1\]"),
        ([0.0, 0.0, 1.0, 1.0], None, 4, "one int per probe"),
    ],
    ids=[
        "one-replica", "tower-gap", "one-tower", "rows", "runs-length", "run-without-tower", "unbalanced-run", "floats"
    ],
)
def test_bad_probe_layouts_raise_a_clear_error(probe_towers, probe_runs, num_rows, message):
    with pytest.raises(ValueError, match=message):
        compute_preference([1, 2], -np.ones((num_rows, 2)), probe_towers=probe_towers, probe_runs=probe_runs)


def test_probe_runs_need_probe_towers_and_matching_merges():
    with pytest.raises(ValueError, match=r"probe_runs=\[0, 1\] needs probe_towers"):
        compute_preference([1, 2], -np.ones((2, 2)), probe_runs=[0, 1])
    paired = ReplicaPreferenceAccumulator([0, 0, 1, 1], [0, 1, 0, 1])
    with pytest.raises(ValueError, match="cannot merge"):
        paired.merge(ReplicaPreferenceAccumulator([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="no predictions"):
        paired.compute()
