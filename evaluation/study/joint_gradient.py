"""
The joint-gradient experiment (docs/study.md, "The joint gradient, pre-registered"), computed from the kept files
alone: two arms of one architecture (a cooperative model whose towers also have heads and losses of their own), in
one of which the joint loss's gradient reaches the towers and in the other stops at their outputs. Runs are paired
by seed (the same initial weights and data order).

Per run, text and trajectory point (`RUN_ENDPOINTS`):
1. the cross-fitted r (factorial.cross_fitted_r);
3. the part-of-speech z (factorial.part_of_speech_z), the same z of the run's probe-noise-only pseudo-preference
   (`noise_only_z`: each tower's replicas split into two pseudo-towers), and their difference, the primary
   endpoint 3 ("z over noise"); the difference again at every tag threshold of `TAG_THRESHOLDS` (sensitivity);
4. the ablation agreement (the run's correlation of the mean-ablation preference with the probe preference).
Per arm, each endpoint's mean over seeds with its t interval; between arms, the paired difference (joint minus
stopped, by seed) with its t interval and the exact sign-flip permutation p.
Endpoint 2, per arm: the cross-seed matched r over its seed pairs, read both by the 2x2's rule (the pair-bootstrap
interval above the null's 95th percentile) and by a seed-level permutation test (the mean |r| against the same
null); beside them a seed-level bootstrap interval, and between arms the difference with a seed-level interval.
"""

import dataclasses
import itertools
import json

import numpy as np
import pandas as pd

from twotower.training.arguments import load_config

from ..scoring.parts_of_speech_tagging import AGREEMENT_THRESHOLD
from .cross_fit import t_interval
from .factorial import KeptPoint, cross_fitted_r, kept_points, part_of_speech_z, type_preferences
from .parts_of_speech import cross_fitted_function_content_contrast
from .verdicts import (
    BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, RunTypes, _aligned_correlation, cross_seed, interval,
    shared_type_correlation,
)

ARMS = ("joint", "stopped")
ARM_NAMES = {"joint": "joint gradient", "stopped": "joint gradient stopped"}
NULL_PERMUTATIONS = 1000  # as pre-registered for the cross-seed null
TAG_THRESHOLDS = (0.6, 0.7, 0.8, 0.9, 0.95)  # 0.8, the tagging's own, is primary; the rest is sensitivity
SIGNIFICANCE = 1 - CONFIDENCE


def arm_families(study) -> dict[str, str]:
    """
    {"joint": family, "stopped": family}: two families alike in everything but `joint_gradient` (one pretraining
    recipe, the same other training options), both with `tower_heads`; empty where the study has none.
    """
    arms = {}
    for name, family in study.families.items():
        options = {**dataclasses.asdict(load_config(family.pretrain_recipe)), **study.pretrain, **family.overrides}
        if not options.get("tower_heads"):
            continue
        others = {key: value for key, value in family.overrides.items() if key != "joint_gradient"}
        key = (family.pretrain_recipe, json.dumps(others, sort_keys=True))
        arms.setdefault(key, {})["stopped" if options.get("joint_gradient") is False else "joint"] = name
    return next((found for found in arms.values() if len(found) == 2), {})


def tags_at(table: pd.DataFrame, threshold: float) -> dict[int, str]:
    """{token id: UPOS} of a kept tags table (TypeTags.table()) with the majority-tag share threshold `threshold`."""
    tagged = table[table["agreement"] >= threshold]
    return dict(zip(tagged["token_id"].tolist(), tagged["tag"].tolist()))


def noise_only_table(type_sums: pd.DataFrame, tower: int, replicas_per_tower: int) -> pd.DataFrame:
    """
    A two-"tower" type_sums table of one tower's probe noise alone: pseudo-tower 0 holds replicas 0, 2, ... of
    `tower` and pseudo-tower 1 replicas 1, 3, ..., so that each cross-fitting group of the pseudo-run holds replicas of
    the real run's same group (the first and the second half of the tower's replicas). Its preference is what the
    probes' noise gives where the towers cannot differ.
    """
    if replicas_per_tower < 4 or replicas_per_tower % 4:
        raise ValueError(f"a noise-only pseudo-run splits each group of replicas in two: needs a multiple of 4 "
                         f"replicas per tower, got {replicas_per_tower}.")
    first = tower * replicas_per_tower
    order = [*range(0, replicas_per_tower, 2), *range(1, replicas_per_tower, 2)]
    columns = {f"logprob_sum_probe{new}": type_sums[f"logprob_sum_probe{first + old}"] for new, old in enumerate(order)}
    return pd.DataFrame({"half": type_sums["half"], "token_id": type_sums["token_id"], "count": type_sums["count"],
                         **columns})


def contrast_z(type_sums, type_tags, num_towers, replicas_per_tower, min_count) -> float | None:
    return cross_fitted_function_content_contrast(type_sums, type_tags, num_towers, replicas_per_tower, min_count)["z"]


def noise_only_z(point: KeptPoint, type_tags: dict) -> float | None:
    """The part-of-speech z of the run's probe noise alone: the mean over towers of each noise-only pseudo-run's z."""
    values = [contrast_z(noise_only_table(point.type_sums, tower, point.replicas_per_tower), type_tags, 2,
                         point.replicas_per_tower // 2, point.min_count) for tower in range(point.num_towers)]
    return None if any(value is None for value in values) else float(np.mean(values))


def z_over_noise(point: KeptPoint, threshold: float) -> float | None:
    """The run's part-of-speech z less its noise-only z, with the text's tags at `threshold` (None untagged)."""
    if point.type_tag_table is None:
        return None
    tags = tags_at(point.type_tag_table, threshold)
    z = contrast_z(point.type_sums, tags, point.num_towers, point.replicas_per_tower, point.min_count)
    noise = noise_only_z(point, tags)
    return None if z is None or noise is None else z - noise


def ablation_agreement(point: KeptPoint) -> float | None:
    return (point.scores.get("ablation") or {}).get("correlation_with_probe_preference")


def noise_z_primary(point: KeptPoint) -> float | None:
    if point.type_tag_table is None:
        return None
    return noise_only_z(point, tags_at(point.type_tag_table, AGREEMENT_THRESHOLD))


PRIMARY_Z_OVER_NOISE = "z_over_noise"
# per-run endpoints: name -> function of a KeptPoint (None where the run has no value)
RUN_ENDPOINTS = {
    "cross_fitted_r": cross_fitted_r,
    "part_of_speech_z": part_of_speech_z,
    "noise_only_z": noise_z_primary,
    PRIMARY_Z_OVER_NOISE: lambda point: z_over_noise(point, AGREEMENT_THRESHOLD),
    **{f"z_over_noise_at_{threshold}": (lambda point, threshold=threshold: z_over_noise(point, threshold))
       for threshold in TAG_THRESHOLDS if threshold != AGREEMENT_THRESHOLD},
    "ablation_agreement": ablation_agreement,
}


def sign_flip_p(differences) -> float:
    """The exact two-sided permutation p of a paired mean difference: every sign flip of the seeds' differences."""
    differences = np.asarray(differences, float)
    flips = np.array(list(itertools.product((1, -1), repeat=differences.size)))
    means = (flips * differences).mean(axis=1)
    observed = abs(differences.mean())
    return float(np.mean(np.abs(means) >= observed - 1e-12 * max(1.0, observed)))


def paired_difference(joint: dict[int, float], stopped: dict[int, float]) -> dict:
    """Joint minus stopped over the seeds both arms have: mean, t interval, exact sign-flip p, per seed."""
    seeds = sorted(seed for seed in set(joint) & set(stopped) if joint[seed] is not None and stopped[seed] is not None)
    differences = [joint[seed] - stopped[seed] for seed in seeds]
    figure = t_interval(differences) | {"per_seed": dict(zip(seeds, differences))}
    return figure | {"p": sign_flip_p(differences) if len(differences) >= 2 else None}


def endpoint_analysis(values: dict[str, dict[int, float]]) -> dict:
    """One per-run endpoint ({arm: {seed: value}}): each arm's mean and t interval, and the paired difference."""
    arms = {arm: t_interval(list(per_seed.values())) | {"per_seed": per_seed} for arm, per_seed in values.items()}
    return {"arms": arms, "difference": paired_difference(values.get("joint", {}), values.get("stopped", {}))}


def seed_level_recurrence(runs: list[RunTypes], null_permutations: int = NULL_PERMUTATIONS,
                          resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict | None:
    """
    Endpoint 2 read at the level of seeds: the mean matched r over seed pairs; its permutation p against the null of
    types permuted within each pair (`null_permutations` draws, p = (1 + draws at least as large) / (1 + draws));
    and its interval from resampling seeds (the mean over pairs of distinct drawn seeds), which keeps the pairs'
    dependence (every seed is in several pairs). Also the per-pair values and each draw's null mean.
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
    boot = np.array([_distinct_pair_mean(pair_r, drawn) for drawn in draws])
    return {"r": observed, "r_ci": interval(boot[np.isfinite(boot)]), "r_resamples": boot,
            "p": float((1 + np.sum(null >= observed)) / (1 + null_permutations)),
            "null_r": float(null.mean()), "null_r_95": float(np.percentile(null, 95)),
            "num_pairs": len(pairs), "seeds": [run.seed for run in runs]}


def _distinct_pair_mean(pair_r: np.ndarray, drawn: np.ndarray) -> float:
    """The mean matched r over the pairs of drawn seeds that are two different seeds (NaN where all are one)."""
    first, second = np.triu_indices(drawn.size, k=1)
    values = pair_r[drawn[first], drawn[second]]
    return float(np.nanmean(values)) if np.isfinite(values).any() else np.nan


def recurrence(runs_by_arm: dict[str, list[RunTypes]]) -> dict:
    """Endpoint 2 per arm, both ways (the 2x2's rule with 1,000 null draws; the seed-level test), and between arms
    the difference of the mean matched r with the interval of seeds resampled alike in both arms (paired by seed)."""
    arms = {}
    for arm, runs in runs_by_arm.items():
        rule = cross_seed(runs, null_permutations=NULL_PERMUTATIONS)
        level = seed_level_recurrence(runs)
        if rule is None or level is None:
            continue
        rule.pop("r_resamples")
        arms[arm] = {"pair_rule": rule | {"recurs": bool(rule["r_ci"][0] > rule["null_r_95"])},
                     "seed_level": {k: v for k, v in level.items() if k != "r_resamples"}
                     | {"recurs": level["p"] < SIGNIFICANCE}}
    difference = None
    if set(arms) == set(ARMS):
        difference = paired_recurrence_difference(runs_by_arm["joint"], runs_by_arm["stopped"])
    return {"arms": arms, "difference": difference}


def paired_recurrence_difference(joint: list[RunTypes], stopped: list[RunTypes],
                                 resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict:
    """The joint arm's mean matched r minus the stopped arm's, over their common seeds, with an interval from
    drawing the same seeds in both arms."""
    seeds = sorted({run.seed for run in joint} & {run.seed for run in stopped})
    matrices = []
    for runs in (joint, stopped):
        by_seed = {run.seed: run for run in runs}
        ordered = [by_seed[s] for s in seeds]
        matrix = np.full((len(seeds), len(seeds)), np.nan)
        for i, j in itertools.combinations(range(len(seeds)), 2):
            matrix[i, j] = matrix[j, i] = shared_type_correlation(ordered[i], ordered[j])[2]
        matrices.append(matrix)
    rng = np.random.default_rng(seed)
    draws = rng.integers(len(seeds), size=(resamples, len(seeds)))
    boot = np.array([_distinct_pair_mean(matrices[0], d) - _distinct_pair_mean(matrices[1], d) for d in draws])
    value = float(np.nanmean(matrices[0]) - np.nanmean(matrices[1]))
    return {"value": value, "ci": interval(boot[np.isfinite(boot)]), "seeds": seeds}


def point_analysis(points: list[tuple[dict, KeptPoint]], endpoints: dict) -> dict:
    """Every per-run endpoint's arms and paired difference, and endpoint 2, at one text and point."""
    analyses = {}
    for name, endpoint in endpoints.items():
        values = {arm: {} for arm in ARMS}
        for codes, point in points:
            value = endpoint(point)
            if value is not None:
                values[codes["arm"]][codes["seed"]] = value
        if any(values.values()):
            analyses[name] = endpoint_analysis(values)
    runs_by_arm = {arm: [] for arm in ARMS}
    for codes, point in sorted(points, key=lambda item: item[0]["seed"]):
        runs_by_arm[codes["arm"]].append(type_preferences(point))
    return {"endpoints": analyses, "recurrence": recurrence(runs_by_arm)}


def _excludes_zero_above(figure) -> bool:
    return figure is not None and figure.get("ci") is not None and figure["ci"][0] > 0


def gradient_explanation(final: dict, primary_text: str) -> str:
    """
    What endpoint 1 says (docs/study.md, decided before the data), from the paired difference D (joint minus
    stopped) and the stopped arm's own mean S on the primary text:
    "the split needs the joint gradient": D's interval above 0 on the primary text, D's estimate above 0 on every
        other text, and S's interval not above 0;
    "the joint gradient adds to a split the architecture makes": D as above and S's interval above 0;
    "the architecture makes the split, no effect of the joint gradient shown": D's interval holds 0, S's above 0;
    "stopping the joint gradient makes the split more reproducible": D's interval below 0;
    else "neither shown".
    """
    if primary_text not in final or "cross_fitted_r" not in final[primary_text]["endpoints"]:
        return "too few runs"
    analysis = final[primary_text]["endpoints"]["cross_fitted_r"]
    difference, stopped = analysis["difference"], analysis["arms"]["stopped"]
    if difference["ci"] is None:
        return "too few runs"
    others = [result["endpoints"]["cross_fitted_r"]["difference"]["value"] for text, result in final.items()
              if text != primary_text and "cross_fitted_r" in result["endpoints"]]
    if difference["ci"][0] > 0 and all(value is not None and value > 0 for value in others):
        if _excludes_zero_above(stopped):
            return "the joint gradient adds to a split the architecture makes"
        return "the split needs the joint gradient"
    if difference["ci"][1] < 0:
        return "stopping the joint gradient makes the split more reproducible"
    if difference["ci"][0] <= 0 <= difference["ci"][1] and _excludes_zero_above(stopped):
        return "the architecture makes the split, no effect of the joint gradient shown"
    return "neither shown"


def lean_beyond_noise(final: dict) -> dict:
    """
    Endpoint 3's words per arm: "beyond probe noise on every text" where the arm's mean z over noise (tags at 0.8)
    has its t interval above 0 on every text, "on TEXT only" where on some, else "not shown"; and the thresholds of
    TAG_THRESHOLDS at which that interval holds 0 on some text (the sensitivity the words carry).
    """
    words = {}
    for arm in ARMS:
        above, fragile = [], set()
        for text, result in final.items():
            for threshold in TAG_THRESHOLDS:
                name = PRIMARY_Z_OVER_NOISE if threshold == AGREEMENT_THRESHOLD else f"z_over_noise_at_{threshold}"
                figure = result["endpoints"].get(name, {}).get("arms", {}).get(arm)
                if figure is None:
                    continue
                if not _excludes_zero_above(figure):
                    fragile.add(threshold)
                elif threshold == AGREEMENT_THRESHOLD:
                    above.append(text)
        if not above:
            reading = "not shown"
        elif len(above) == len(final):
            reading = "beyond probe noise on every text"
        else:
            reading = "beyond probe noise on " + ", ".join(above) + " only"
        words[arm] = {"reading": reading, "texts_above": above, "thresholds_holding_zero": sorted(fragile)}
    return words


INTERIM_VERDICT = {"explanation": "not read before every planned run is kept", "recurs": {}, "lean": {}}


def gradient_verdict(final: dict, primary_text: str) -> dict:
    """The pre-registered words of the final point: endpoint 1's explanation, endpoint 2's recurrence per arm and
    text by both tests, and endpoint 3's lean beyond probe noise per arm."""
    return {
        "explanation": gradient_explanation(final, primary_text),
        "recurs": {text: {arm: {"pair_rule": figure["pair_rule"]["recurs"], "seed_level": figure["seed_level"]["recurs"]}
                          for arm, figure in result["recurrence"]["arms"].items()}
                   for text, result in final.items()},
        "lean": lean_beyond_noise(final),
    }


def joint_gradient_analysis(summaries, runs_dir, study, endpoints=None, type_tag_table_of=None) -> dict | None:
    """
    The experiment from the kept runs (None unless the study has the two arms): per text and trajectory point
    (`multiple`: the step over the first point's), every endpoint, and once every planned run is kept the
    pre-registered words (`gradient_verdict`). `type_tag_table_of(text, tokenizer_file)`: the kept tags table of a
    scored text for a run's tokenizer (TypeTags.table(); None where not tagged).
    """
    families = arm_families(study)
    if not families:
        return None
    arm_of = {family: arm for arm, family in families.items()}
    runs = [summary for summary in summaries if summary["run"]["family"] in arm_of]
    planned = sum(run.family in arm_of for run in study.runs())
    result = {"families": families, "primary_text": next(iter(study.eval_texts)), "points": [],
              "runs_kept": len(runs), "runs_planned": planned, "verdict": INTERIM_VERDICT, "final_step": None}
    if not runs:
        return result
    endpoints = RUN_ENDPOINTS if endpoints is None else endpoints
    steps = sorted({point["step"] for summary in runs for point in summary["trajectory"]})
    factors = {family: {"arm": arm} for family, arm in arm_of.items()}
    for text in study.eval_texts:
        for step in steps:
            points = kept_points(runs, runs_dir, factors, text, step)
            for _, point in points:
                if type_tag_table_of is not None:
                    point.type_tag_table = type_tag_table_of(text, point.run_dir / "tokenizer.json.gz")
                if point.type_tag_table is not None:
                    point.type_tags = tags_at(point.type_tag_table, AGREEMENT_THRESHOLD)
            if points:
                result["points"].append({"text": text, "step": step, "multiple": step / steps[0],
                                         **point_analysis(points, endpoints)})
    result["final_step"] = steps[-1]
    if len(runs) >= planned:
        final = {point["text"]: point for point in result["points"] if point["step"] == steps[-1]}
        result["verdict"] = gradient_verdict(final, result["primary_text"])
    return result
