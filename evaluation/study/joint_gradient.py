"""
The joint-gradient experiment (docs/study.md, "The joint gradient, pre-registered"), computed from the kept files
alone: two arms of one architecture (a cooperative model whose towers also have heads and losses of their own), in
one of which the joint loss's gradient reaches the towers and in the other stops at their outputs. Runs are paired
by seed (the same initial weights and data order).

Per run, text and trajectory point (`RUN_ENDPOINTS`):
1. the cross-fitted r (factorial.cross_fitted_r);
3. the part-of-speech z (factorial.part_of_speech_z), the same z of the run's probe-noise-only pseudo-preference
   (factorial.noise_only_z: each tower's replicas split into two pseudo-towers), and their difference, the primary
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

from twotower.training.arguments import load_config

from ..scoring.parts_of_speech_tagging import AGREEMENT_THRESHOLD
from .cross_fit import t_interval
from .factorial import (
    TAG_THRESHOLDS, Z_OVER_NOISE_ENDPOINT, KeptPoint, ablation_agreement, cross_fitted_r, kept_points, noise_only_z,
    part_of_speech_z, type_preferences, z_over_noise,
)
from .verdicts import (
    BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, RunTypes, cross_seed, distinct_pair_mean, interval,
    seed_level_recurrence, shared_type_correlation,
)

ARMS = ("joint", "stopped")
ARM_NAMES = {"joint": "joint gradient", "stopped": "joint gradient stopped"}
SIGNIFICANCE = 1 - CONFIDENCE
PRIMARY_Z_OVER_NOISE = Z_OVER_NOISE_ENDPOINT
# per-run endpoints: name -> function of a KeptPoint (None where the run has no value); the tag thresholds other than
# the tagging's own are endpoint 3's sensitivity
RUN_ENDPOINTS = {
    "cross_fitted_r": cross_fitted_r,
    "part_of_speech_z": part_of_speech_z,
    "noise_only_z": noise_only_z,
    PRIMARY_Z_OVER_NOISE: z_over_noise,
    **{f"z_over_noise_at_{threshold}": (lambda point, threshold=threshold: z_over_noise(point, threshold))
       for threshold in TAG_THRESHOLDS if threshold != AGREEMENT_THRESHOLD},
    "ablation_agreement": ablation_agreement,
}


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


def recurrence(runs_by_arm: dict[str, list[RunTypes]]) -> dict:
    """Endpoint 2 per arm, both ways (the 2x2's rule with 1,000 null draws; the seed-level test), and between arms
    the difference of the mean matched r with the interval of seeds resampled alike in both arms (paired by seed)."""
    arms = {}
    for arm, runs in runs_by_arm.items():
        rule = cross_seed(runs)
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
    boot = np.array([distinct_pair_mean(matrices[0], d) - distinct_pair_mean(matrices[1], d) for d in draws])
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
    TAG_THRESHOLDS at which that interval holds 0 on some text (the sensitivity the words carry), also per text.
    """
    words = {}
    for arm in ARMS:
        above, fragile = [], {}
        for text, result in final.items():
            for threshold in TAG_THRESHOLDS:
                name = PRIMARY_Z_OVER_NOISE if threshold == AGREEMENT_THRESHOLD else f"z_over_noise_at_{threshold}"
                figure = result["endpoints"].get(name, {}).get("arms", {}).get(arm)
                if figure is None:
                    continue
                if not _excludes_zero_above(figure):
                    fragile.setdefault(text, []).append(threshold)
                elif threshold == AGREEMENT_THRESHOLD:
                    above.append(text)
        if not above:
            reading = "not shown"
        elif len(above) == len(final):
            reading = "beyond probe noise on every text"
        else:
            reading = "beyond probe noise on " + ", ".join(above) + " only"
        words[arm] = {"reading": reading, "texts_above": above,
                      "thresholds_holding_zero": sorted({t for thresholds in fragile.values() for t in thresholds}),
                      "thresholds_holding_zero_by_text": fragile}
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
            points = kept_points(runs, runs_dir, factors, text, step, type_tag_table_of)
            if points:
                result["points"].append({"text": text, "step": step, "multiple": step / steps[0],
                                         **point_analysis(points, endpoints)})
    result["final_step"] = steps[-1]
    if len(runs) >= planned:
        final = {point["text"]: point for point in result["points"] if point["step"] == steps[-1]}
        result["verdict"] = gradient_verdict(final, result["primary_text"])
    return result
