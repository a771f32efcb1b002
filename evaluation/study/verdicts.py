"""
The study's verdicts with 95% confidence intervals, bootstrapped over pretraining seeds and token types: per family,
the reliability of the cooperative towers' preference, that of its independent-towers control and their
difference; the two-tower difference over the same-tower floor; the cross-seed matched correlation against its
null (the same matching on unrelated preferences); the comparison at matched probe perplexity along the training
trajectory; and, for the masked family, its loss against the unigram cross-entropy of the text.

The bootstrap is hierarchical: each resample draws the seeds with replacement, then the token types of each drawn
run with replacement, and averages the statistic over the drawn runs. The statistics themselves are the scoring
command's: `preference_reliability` of tower_preference.preference_stats on the same replica-level sampling variance,
`compare_preferences` for the matched correlation.
"""

import itertools
import math
from dataclasses import dataclass

import numpy as np

from ..scoring.report import numbered_columns, tower_columns
from ..tower_preference.comparisons import compare_preferences, matched_correlation
from ..tower_preference.reliability import preference_reliability
from .kept_tables import load_kept_report


BOOTSTRAP_RESAMPLES = 2000
CROSS_SEED_RESAMPLES = 500  # each a tower matching per seed pair: fewer than BOOTSTRAP_RESAMPLES
NULL_PERMUTATIONS = 1000  # the cross-seed null's draws (the 2x2's pre-registration; 100 before it was read)
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0
CONVERGENCE_TOLERANCE = 0.02  # the loss at the run's length within 2% of the loss at the convergence run's length
MASKED_MARGIN_NATS = 1.0  # the masked family must be this far below the unigram cross-entropy
# "emerges from cooperation" needs independent towers to show (almost) none: their reliability's interval below this
NEAR_ZERO_RELIABILITY = 0.1


@dataclass
class RunTypes:
    """One run's eligible token types on one text: what the verdicts resample."""

    name: str
    seed: int
    token_ids: np.ndarray  # [types]
    preference: np.ndarray  # [rows, types] centered preference_nats (two towers: tower 0's row; tower 1 mirrors it)
    sampling_variance: np.ndarray  # [rows, types] the replica-level variance of each preference
    over_floor: np.ndarray  # [types] two-tower difference minus the same-tower floor (nats)

    @property
    def num_types(self) -> int:
        return len(self.token_ids)


def replica_sampling_variance(table, preference_summary, center=False, probe_mean_logprob=None) -> np.ndarray:
    """
    [towers, types] the replica-level sampling variance of each type's preference, the one the scoring command's
    `reliability` uses: over the K paired probe runs, the variance of each run's tower contrast, divided by K. With
    `center` each probe's mean log-probability over all predictions (`probe_mean_logprob` [probes]; by default from
    every type of the table, weighted by its count) is first taken away, as the scoring command does for centered
    preferences.
    """
    towers = np.asarray(preference_summary["probe_towers"])
    num_towers, replicas = towers.max() + 1, preference_summary["replicas_per_tower"]
    if not preference_summary["paired"] or len(set(replicas)) != 1:
        raise ValueError("the study's verdicts need paired probe replicas (the same K per tower, one data order each)")
    logprob = numbered_columns(table, "probe_mean_logprob_probe")  # [probes, types]
    if center and probe_mean_logprob is None:
        count = table["count"].to_numpy()
        logprob = logprob - (logprob * count).sum(axis=1, keepdims=True) / count.sum()
    elif center:  # a kept table of the eligible types: the means over all predictions were kept beside it
        logprob = logprob - np.asarray(probe_mean_logprob)[:, None]
    logprob = logprob.reshape(num_towers, replicas[0], -1)
    contrast = logprob - (logprob.sum(axis=0, keepdims=True) - logprob) / (num_towers - 1)
    return contrast.var(axis=1, ddof=1) / replicas[0]


def load_run_types(score_folder, name: str, seed: int) -> RunTypes:
    """The eligible types of one run's score folder (its preference.json and kept per-type table: kept_tables.py)."""
    kept = load_kept_report(score_folder)
    report, table = kept.report, kept.table
    is_eligible = table["eligible"].to_numpy(dtype=bool)
    eligible = table[is_eligible]
    rows = slice(1) if tower_columns(eligible, "preference_nats").shape[0] == 2 else slice(None)
    variance = replica_sampling_variance(table, report["summary"], center=report["settings"]["center"],
                                         probe_mean_logprob=kept.probe_mean_logprob)
    return RunTypes(
        name=name,
        seed=seed,
        token_ids=eligible["token_id"].to_numpy(),
        preference=tower_columns(eligible, "preference_nats")[rows],
        sampling_variance=variance[rows][:, is_eligible],
        over_floor=(eligible["two_tower_difference_nats"] - eligible["same_tower_difference_nats"]).to_numpy(),
    )


def reliability(run: RunTypes, types=slice(None)):
    """The scoring command's reliability of the run over `types` (indices [..., resampled types]; all by default)."""
    preference = np.moveaxis(run.preference[:, types], 0, -2)  # [..., rows, types]
    variance = np.moveaxis(run.sampling_variance[:, types], 0, -2)
    return preference_reliability(preference, variance)


def preference_over_floor(run: RunTypes, types=slice(None)):
    return run.over_floor[types].mean(axis=-1)


def interval(values) -> list:
    """The percentile interval of bootstrap values at CONFIDENCE."""
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.nanpercentile(values, [tail, 100 - tail])
    return [float(low), float(high)]


def bootstrap(runs: list[RunTypes], statistic, rng) -> np.ndarray:
    """
    [resamples] the statistic averaged over runs, each resample drawing the seeds, then each drawn run's types.
    Each run's statistic is computed on its own type resamples for every (resample, draw) at once.
    """
    num_runs = len(runs)
    drawn = rng.integers(num_runs, size=(BOOTSTRAP_RESAMPLES, num_runs))
    per_run = np.stack([
        statistic(run, rng.integers(run.num_types, size=(BOOTSTRAP_RESAMPLES, num_runs, run.num_types)))
        for run in runs
    ])  # [runs, resamples, draws]
    return per_run[drawn, np.arange(BOOTSTRAP_RESAMPLES)[:, None], np.arange(num_runs)].mean(axis=1)


def estimate(runs: list[RunTypes], statistic, seed_offset: int = 0) -> dict:
    """The statistic's mean over runs (all types), its bootstrap interval and the bootstrap values."""
    values = bootstrap(runs, statistic, np.random.default_rng(BOOTSTRAP_SEED + seed_offset))
    return {"value": float(np.mean([statistic(run) for run in runs])), "ci": interval(values), "values": values}


def shared_type_correlation(first: RunTypes, second: RunTypes):
    """(shared types' preferences of each run [towers, shared], the matched correlation over them)."""
    shared, index_a, index_b = np.intersect1d(first.token_ids, second.token_ids, return_indices=True)
    a, b = _towers(first.preference[:, index_a]), _towers(second.preference[:, index_b])
    return a, b, compare_preferences(shared, a, shared, b)["correlation"]


def _towers(rows):
    """All towers' preferences from the stored rows: with two towers, tower 1's row is minus tower 0's."""
    return np.concatenate([rows, -rows]) if rows.shape[0] == 1 else rows


def _aligned_correlation(a, b, types=None):
    """The matched correlation of two runs' aligned preferences, over `types` (positions; None: all)."""
    if types is not None:
        a, b = a[:, types], b[:, types]
    return matched_correlation(a, b)[0]


def cross_seed(runs: list[RunTypes], null_permutations: int = NULL_PERMUTATIONS) -> dict | None:
    """
    The matched correlation of per-type preferences between seeds (mean over seed pairs), its interval (resampling
    seed pairs and shared types), and its null: the same tower matching between one run's preferences and the other
    run's over randomly permuted types, whose mean and 95th percentile are reported.
    """
    pairs = [shared_type_correlation(first, second) for first, second in itertools.combinations(runs, 2)]
    if not pairs:
        return None
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    values = np.empty(CROSS_SEED_RESAMPLES)
    for index in range(CROSS_SEED_RESAMPLES):
        drawn = [pairs[i] for i in rng.integers(len(pairs), size=len(pairs))]
        values[index] = np.mean(
            [_aligned_correlation(a, b, rng.integers(a.shape[1], size=a.shape[1])) for a, b, _ in drawn]
        )
    null = np.array([
        np.mean([_aligned_correlation(a, b[:, rng.permutation(b.shape[1])]) for a, b, _ in pairs])
        for _ in range(null_permutations)
    ])
    return {
        "r": float(np.mean([r for _, _, r in pairs])),
        "r_ci": interval(values),
        "r_resamples": values,  # the bootstrap values, for differences between groups of runs
        "pair_r": [float(r) for _, _, r in pairs],
        "null_r": float(null.mean()),
        "null_r_95": float(np.percentile(null, 95)),
        "num_shared_types": [int(a.shape[1]) for a, _, _ in pairs],
    }


def seed_level_recurrence(runs: list[RunTypes], null_permutations: int = NULL_PERMUTATIONS,
                          resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict | None:
    """
    The cross-seed matched r read at the level of seeds: the mean matched r over seed pairs; its permutation p
    against the null of types permuted within each pair (`null_permutations` draws, p = (1 + draws at least as large)
    / (1 + draws)); and its interval from resampling seeds (the mean over the pairs of distinct drawn seeds), which
    keeps the pairs' dependence (every seed is in several pairs). `r_resamples`: the bootstrap values.
    """
    if len(runs) < 2:
        return None
    pairs = {(i, j): shared_type_correlation(runs[i], runs[j]) for i, j in itertools.combinations(range(len(runs)), 2)}
    pair_r = np.full((len(runs), len(runs)), np.nan)
    for (i, j), (_, _, r) in pairs.items():
        pair_r[i, j] = pair_r[j, i] = r
    observed = float(np.nanmean(pair_r))
    rng = np.random.default_rng(seed)
    null = np.array([
        np.mean([_aligned_correlation(a, b[:, rng.permutation(b.shape[1])]) for a, b, _ in pairs.values()])
        for _ in range(null_permutations)
    ])
    draws = rng.integers(len(runs), size=(resamples, len(runs)))
    boot = np.array([distinct_pair_mean(pair_r, drawn) for drawn in draws])
    return {"r": observed, "r_ci": interval(boot[np.isfinite(boot)]), "r_resamples": boot,
            "p": float((1 + np.sum(null >= observed)) / (1 + null_permutations)),
            "null_r": float(null.mean()), "null_r_95": float(np.percentile(null, 95)),
            "num_pairs": len(pairs), "seeds": [run.seed for run in runs]}


def distinct_pair_mean(pair_r: np.ndarray, drawn: np.ndarray) -> float:
    """The mean of `pair_r` [seeds, seeds] over the pairs of drawn seeds that are two different seeds (NaN where every
    draw is one seed)."""
    first, second = np.triu_indices(drawn.size, k=1)
    values = pair_r[drawn[first], drawn[second]]
    return float(np.nanmean(values)) if np.isfinite(values).any() else np.nan


def family_verdict(runs: list[RunTypes], control_runs: list[RunTypes]) -> dict:
    """The figures of one family's verdict on one text; without control runs, the control keys are None."""
    family_reliability = estimate(runs, reliability)
    over_floor = estimate(runs, preference_over_floor, seed_offset=1)
    verdict = {
        "reliability": family_reliability["value"],
        "reliability_ci": family_reliability["ci"],
        "preference_over_floor": over_floor["value"],
        "preference_over_floor_ci": over_floor["ci"],
        "control_reliability": None,
        "control_reliability_ci": None,
        "difference": None,
        "difference_ci": None,
        "control_preference_over_floor": None,
        "control_preference_over_floor_ci": None,
        "seeds": sorted(run.seed for run in runs),
        "control_seeds": sorted(run.seed for run in control_runs),
        "num_types": [run.num_types for run in runs],
    }
    if control_runs:
        control = estimate(control_runs, reliability, seed_offset=2)
        control_over_floor = estimate(control_runs, preference_over_floor, seed_offset=3)
        verdict |= {
            "control_reliability": control["value"],
            "control_reliability_ci": control["ci"],
            "difference": family_reliability["value"] - control["value"],
            "difference_ci": interval(family_reliability["values"] - control["values"]),
            "control_preference_over_floor": control_over_floor["value"],
            "control_preference_over_floor_ci": control_over_floor["ci"],
        }
    cross = cross_seed(runs)
    verdict["cross_seed_r"] = cross["r"] if cross else None
    verdict["cross_seed_r_ci"] = cross["r_ci"] if cross else None
    verdict["cross_seed_null_r"] = cross["null_r"] if cross else None
    verdict["cross_seed_null_r_95"] = cross["null_r_95"] if cross else None
    verdict["cross_seed_pairs"] = cross["pair_r"] if cross else []
    control_cross = cross_seed(control_runs)  # does the control's split recur across seeds? (its own null)
    for key in ("r", "r_ci", "null_r", "null_r_95"):
        verdict[f"control_cross_seed_{key}"] = control_cross[key] if control_cross else None
    verdict["conclusion"] = conclusion(verdict)
    return verdict


def difference_conclusion(difference_ci, control_reliability_ci) -> str | None:
    """The words a reliability difference's interval allows, or None when it holds 0."""
    low, high = difference_ci
    if low > 0:
        if control_reliability_ci[1] < NEAR_ZERO_RELIABILITY:
            return "emerges from cooperation"
        return "more reliable with cooperation"
    if high < 0:
        return "weaker with cooperation"
    return None


def conclusion(verdict: dict) -> str:
    """
    What the intervals allow one to say: "not there" (the preference's interval over the floor holds 0), "no
    control" (no control runs), "emerges from cooperation" (the reliability difference's interval above 0 and the
    control's reliability near 0: its interval below NEAR_ZERO_RELIABILITY), "more reliable with cooperation" (the
    difference above 0, the control reliable too), "weaker with cooperation" (below 0), "exists without
    cooperation" (the difference's interval holds 0 and the control's preference is above the floor too), else
    "undecided" (the difference holds 0, the control's preference does not clear the floor).
    """
    if verdict["preference_over_floor_ci"][0] <= 0:
        return "not there"
    if verdict["difference_ci"] is None:
        return "no control"
    words = difference_conclusion(verdict["difference_ci"], verdict.get("control_reliability_ci"))
    if words is not None:
        return words
    if verdict["control_preference_over_floor_ci"][0] > 0:
        return "exists without cooperation"
    return "undecided"


def probe_perplexity(scores: dict) -> float:
    """One figure of probe quality: the geometric mean of the towers' probe perplexities."""
    return float(math.exp(np.mean(np.log(scores["perplexity"]["probes"]))))


def trajectory_rows(summaries: list[dict], text: str) -> list[dict]:
    """Per run and trajectory step: pretraining validation loss, probe perplexity and the scoring's reliability."""
    rows = []
    for summary in summaries:
        for point in summary["trajectory"]:
            scores = point["scores"].get(text)
            if scores is None:
                continue
            rows.append({
                "run": summary["run"]["name"],
                "family": summary["run"]["family"],
                "seed": summary["run"]["seed"],
                "step": point["step"],
                "validation_loss": (point["pretrain_validation"] or {}).get("loss"),
                "probe_perplexity": probe_perplexity(scores),
                "joint_perplexity": scores["perplexity"]["joint"],
                "reliability": scores["reliability"],
                "preference_over_floor": difference_or_none(
                    scores["two_tower_difference_nats"], scores["same_tower_floor_nats"]
                ),
            })
    return rows


def difference_or_none(value, reference):
    return None if value is None or reference is None else value - reference


def at_perplexity(points: list[dict], perplexity: float) -> tuple[float, bool]:
    """(reliability interpolated in log probe perplexity at `perplexity`, whether it lies within the points' range)."""
    ordered = sorted(points, key=lambda point: point["probe_perplexity"])
    log_ppl = np.log([point["probe_perplexity"] for point in ordered])
    value = float(np.interp(np.log(perplexity), log_ppl, [point["reliability"] for point in ordered]))
    return value, bool(log_ppl[0] - 1e-9 <= np.log(perplexity) <= log_ppl[-1] + 1e-9)


def matched_quality(trajectory: list[dict], family: str, control: str) -> dict | None:
    """
    Per seed that both arms ran: the reliability of each arm at the same probe perplexity, the final one of the
    arm whose probes ended worse (both reached it, so the other arm's is interpolated along its trajectory);
    their differences, mean, and an interval from resampling seeds (none from one seed: it would have no width).
    """
    by_run = {}
    for row in trajectory:
        by_run.setdefault((row["family"], row["seed"]), []).append(row)
    seeds_of = {name: {seed for arm, seed in by_run if arm == name} for name in (family, control)}
    seeds = sorted(seeds_of[family] & seeds_of[control])
    if not seeds:
        return None
    per_seed = []
    for seed in seeds:
        arms = by_run[(family, seed)], by_run[(control, seed)]
        finals = [max(points, key=lambda point: point["step"])["probe_perplexity"] for points in arms]
        matched = max(finals)
        (cooperative, inside_a), (independent, inside_b) = (at_perplexity(points, matched) for points in arms)
        per_seed.append({"seed": seed, "probe_perplexity": matched, "reliability": cooperative,
                         "control_reliability": independent, "difference": cooperative - independent,
                         "within_trajectories": inside_a and inside_b})
    differences = np.array([row["difference"] for row in per_seed])
    difference_ci = None
    if len(differences) > 1:
        rng = np.random.default_rng(BOOTSTRAP_SEED)
        draws = rng.integers(len(differences), size=(BOOTSTRAP_RESAMPLES, len(differences)))
        difference_ci = interval(differences[draws].mean(axis=1))
    return {"per_seed": per_seed, "difference": float(differences.mean()), "difference_ci": difference_ci}


def unigram_cross_entropy(tokenizer, train_file: str, validation_file: str) -> float:
    """Nats per token of an add-one unigram model of the train text's tokens, scored on the validation text."""
    def token_counts(path):
        with open(path, encoding="utf-8") as file:
            lines = file.readlines()
        ids = tokenizer(lines, add_special_tokens=False, verbose=False)["input_ids"]  # counts, not model inputs
        return np.bincount(np.concatenate([np.asarray(line, dtype=np.int64) for line in ids]), minlength=len(tokenizer))

    train, validation = token_counts(train_file), token_counts(validation_file)
    log_probability = np.log((train + 1) / (train.sum() + len(tokenizer)))
    return float(-(validation * log_probability).sum() / validation.sum())


def convergence_check(run_history: list[dict], long_history: list[dict], length: int, long_length: int) -> dict:
    """The validation loss at the run's length and at the long run's, and whether they are within 2%."""
    at_length = next(entry["loss"] for entry in run_history if entry["step"] == length)
    at_long_length = next(entry["loss"] for entry in long_history if entry["step"] == long_length)
    gap = (at_length - at_long_length) / at_long_length
    return {"length": length, "loss": at_length, "long_length": long_length, "long_loss": at_long_length,
            "relative_gap": gap, "converged": gap <= CONVERGENCE_TOLERANCE}
