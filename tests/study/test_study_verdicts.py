"""The study's verdicts on planted effects: reliability and its difference to a control, the floor, cross-seed
agreement against its null, matched quality, convergence and the unigram baseline, against independent computations."""

import json
import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from twotower.evaluation.study.verdicts import (
    RunTypes, at_perplexity, conclusion, convergence_check, cross_seed, family_verdict, matched_quality,
    preference_reliability, reliability, replica_sampling_variance, unigram_cross_entropy,
)
from twotower.training.run.run_folder import EVAL_HISTORY, RUNS_DIR, read_eval_history


NUM_TYPES = 400


def planted_run(seed, signal, noise_sd, over_floor=0.0, name=None):
    """A run whose per-type preference is `signal` plus replica noise of standard deviation noise_sd."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(scale=noise_sd, size=NUM_TYPES)
    return RunTypes(
        name=name or f"run-s{seed}", seed=seed, token_ids=np.arange(NUM_TYPES),
        preference=(signal + noise)[None], sampling_variance=np.full((1, NUM_TYPES), noise_sd**2),
        over_floor=over_floor + rng.normal(scale=0.01, size=NUM_TYPES),
    )


def test_reliability_is_the_share_of_variance_beyond_the_replica_noise():
    run = planted_run(0, np.random.default_rng(1).normal(size=NUM_TYPES), noise_sd=0.5)
    expected = 1 - 0.25 / np.var(run.preference[0], ddof=1)
    assert reliability(run) == pytest.approx(expected, rel=1e-12)
    assert reliability(run) == pytest.approx(1 / 1.25, abs=0.05)  # signal variance 1, noise variance 0.25


def test_cooperation_planted_in_one_arm_is_found_with_intervals():
    signal = np.random.default_rng(7).normal(size=NUM_TYPES)
    cooperative = [planted_run(seed, signal, noise_sd=0.3, over_floor=0.05) for seed in range(3)]
    control = [planted_run(10 + seed, np.zeros(NUM_TYPES), noise_sd=0.3) for seed in range(3)]
    verdict = family_verdict(cooperative, control)
    low, high = verdict["reliability_ci"]
    assert low < verdict["reliability"] < high and low > 0.8
    assert verdict["control_reliability_ci"][0] < 0 < verdict["control_reliability_ci"][1]
    assert verdict["difference"] == pytest.approx(verdict["reliability"] - verdict["control_reliability"])
    assert verdict["difference_ci"][0] > 0.5
    assert verdict["preference_over_floor_ci"][0] > 0.04
    assert verdict["conclusion"] == "emerges from cooperation"
    # the same signal in every seed recurs far beyond the matching of unrelated preferences
    assert verdict["cross_seed_r"] > 0.8 > 0.2 > verdict["cross_seed_null_r_95"]
    assert verdict["seeds"] == [0, 1, 2] and verdict["control_seeds"] == [10, 11, 12]


def test_no_difference_between_arms_is_not_called_cooperation():
    signals = [np.random.default_rng(seed).normal(size=NUM_TYPES) for seed in range(6)]
    cooperative = [planted_run(seed, signals[seed], 0.3, over_floor=0.05) for seed in range(3)]
    control = [planted_run(seed + 3, signals[seed + 3], 0.3, over_floor=0.05) for seed in range(3)]
    verdict = family_verdict(cooperative, control)
    assert verdict["difference_ci"][0] < 0 < verdict["difference_ci"][1]
    assert verdict["conclusion"] == "exists without cooperation"
    # independent signals per seed: the matched correlation stays within its null
    assert verdict["cross_seed_r"] < verdict["cross_seed_null_r_95"] + 0.05


def test_conclusions_follow_the_intervals():
    base = {"preference_over_floor_ci": [0.01, 0.02], "difference_ci": [-0.3, -0.1],
            "control_preference_over_floor_ci": [-0.01, 0.01]}
    assert conclusion(base) == "weaker with cooperation"
    assert conclusion(base | {"preference_over_floor_ci": [-0.01, 0.02]}) == "not there"
    assert conclusion(base | {"difference_ci": None}) == "no control"
    assert conclusion(base | {"difference_ci": [-0.1, 0.1]}) == "undecided"  # the control is not above the floor


def test_cross_seed_r_is_compare_preferences_over_shared_types():
    rng = np.random.default_rng(3)
    first = planted_run(0, rng.normal(size=NUM_TYPES), 0.5)
    second = planted_run(1, -first.preference[0], 0.5)  # the same split, towers named the other way round
    second.token_ids = second.token_ids + 100  # shares types 100..399 with the first run
    result = cross_seed([first, second])
    shared = np.arange(100, NUM_TYPES)
    expected = abs(np.corrcoef(first.preference[0, shared], second.preference[0, : NUM_TYPES - 100])[0, 1])
    assert result["r"] == pytest.approx(expected, rel=1e-9) and result["num_shared_types"] == [300]
    assert result["r_ci"][0] < result["r"] < result["r_ci"][1]


def test_replica_sampling_variance_is_the_scoring_commands():
    # per type, K = 3 paired replicas of two towers; the contrast of run r is tower 0 minus tower 1
    rng = np.random.default_rng(0)
    logprob = rng.normal(-5, 1, size=(2, 3, 50))
    table = pd.DataFrame({f"probe_mean_logprob_probe{p}": logprob.reshape(6, 50)[p] for p in range(6)})
    summary = {"probe_towers": [0, 0, 0, 1, 1, 1], "replicas_per_tower": [3, 3], "paired": True}
    variance = replica_sampling_variance(table, summary)
    contrast = logprob[0] - logprob[1]
    np.testing.assert_allclose(variance[0], contrast.var(axis=0, ddof=1) / 3)
    np.testing.assert_allclose(variance[1], variance[0])
    # centered: each probe's count-weighted mean over every type taken away first
    table["count"] = rng.integers(1, 20, size=50)
    centered = logprob - (logprob * table["count"].to_numpy()).sum(axis=2, keepdims=True) / table["count"].sum()
    expected = (centered[0] - centered[1]).var(axis=0, ddof=1) / 3
    np.testing.assert_allclose(replica_sampling_variance(table, summary, center=True)[0], expected)
    with pytest.raises(ValueError, match="paired probe replicas"):
        replica_sampling_variance(table, summary | {"paired": False})
    assert preference_reliability(contrast.mean(0)[None], variance[:1]) < 1


def test_matched_quality_interpolates_in_log_perplexity():
    trajectory = [
        {"family": "causal", "seed": 0, "step": 1, "probe_perplexity": 200.0, "reliability": 0.5},
        {"family": "causal", "seed": 0, "step": 2, "probe_perplexity": 100.0, "reliability": 0.7},
        {"family": "control", "seed": 0, "step": 1, "probe_perplexity": 210.0, "reliability": 0.4},
        {"family": "control", "seed": 0, "step": 2, "probe_perplexity": 120.0, "reliability": 0.45},
    ]
    result = matched_quality(trajectory, "causal", "control")
    (row,) = result["per_seed"]
    weight = math.log(200 / 120) / math.log(200 / 100)
    assert row["probe_perplexity"] == 120.0 and row["within_trajectories"]
    assert row["reliability"] == pytest.approx(0.5 + weight * 0.2)
    assert row["control_reliability"] == pytest.approx(0.45)
    assert result["difference"] == pytest.approx(row["reliability"] - 0.45)
    assert result["difference_ci"] is None  # one seed: resampling seeds gives no interval
    second_seed = [dict(point, seed=1, reliability=point["reliability"] - 0.1 * (point["family"] == "causal"))
                   for point in trajectory]
    both = matched_quality(trajectory + second_seed, "causal", "control")
    assert both["difference"] == pytest.approx(row["reliability"] - 0.45 - 0.05)
    low, high = both["difference_ci"]
    assert low == pytest.approx(row["reliability"] - 0.55) and high == pytest.approx(row["reliability"] - 0.45)
    assert at_perplexity(trajectory[:2], 300.0) == (0.5, False)  # outside: the nearest point stands in
    assert matched_quality(trajectory, "causal", "missing") is None


def test_convergence_check_compares_the_ends_of_both_runs():
    run = [{"step": 50, "loss": 5.0}, {"step": 100, "loss": 4.1}]
    long_run = [{"step": 100, "loss": 4.3}, {"step": 200, "loss": 4.0}]
    check = convergence_check(run, long_run, 100, 200)
    assert check["relative_gap"] == pytest.approx(0.1 / 4.0) and not check["converged"]
    assert convergence_check(run, [{"step": 200, "loss": 4.05}], 100, 200)["converged"]


def test_unigram_cross_entropy_is_add_one_unigram(tmp_path):
    words = ["the", "cat", "sat", "on", "mat", "a", "dog"]
    backend = Tokenizer(models.WordLevel({word: index for index, word in enumerate(words + ["[UNK]"])}, "[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    (tmp_path / "train.txt").write_text("the cat sat on the mat\nthe dog sat\n")
    (tmp_path / "valid.txt").write_text("a cat sat on a dog\n")
    counts = Counter("the cat sat on the mat the dog sat".split())
    total, vocab = sum(counts.values()), len(tokenizer)
    expected = -np.mean([math.log((counts[word] + 1) / (total + vocab)) for word in "a cat sat on a dog".split()])
    assert unigram_cross_entropy(tokenizer, tmp_path / "train.txt", tmp_path / "valid.txt") == pytest.approx(expected)


def test_eval_history_keeps_the_last_evaluation_of_each_step(tmp_path):
    history = tmp_path / RUNS_DIR / EVAL_HISTORY
    history.parent.mkdir()
    lines = [{"step": 100, "loss": 5.0}, {"step": 200, "loss": 4.5}, {"step": 200, "loss": 4.4}]
    history.write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"step": 300, "lo')  # cut by a kill
    assert read_eval_history(tmp_path) == [{"step": 100, "loss": 5.0}, {"step": 200, "loss": 4.4}]
    assert read_eval_history(tmp_path / "missing") == []
