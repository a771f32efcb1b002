"""
The joint-gradient experiment's tables for the study document (templates/study_joint_gradient.md.j2): per text and
trajectory point, each endpoint's arms (mean over seeds with its t interval, each seed's value) and their paired
difference, endpoint 2 both ways, and the final point's words.
"""

import pandas as pd

from .factorial import TAG_THRESHOLDS
from .factorial_report import _p, _with_ci, point_label
from .joint_gradient import ARM_NAMES, ARMS, PRIMARY_Z_OVER_NOISE
from .verdicts import NULL_PERMUTATIONS

ENDPOINT_NAMES = {
    "cross_fitted_r": "cross-fitted r",
    "part_of_speech_z": "part-of-speech z",
    "noise_only_z": "part-of-speech z of probe noise alone",
    PRIMARY_Z_OVER_NOISE: "part-of-speech z over probe noise",
    "ablation_agreement": "ablation agreement",
}


def arms_table(points: list[dict], endpoint: str) -> pd.DataFrame:
    """One row per text and point: each arm's mean [t interval] and per-seed values, the paired difference and p."""
    rows = []
    for point in points:
        analysis = point["endpoints"].get(endpoint)
        if analysis is None:
            continue
        row = {"text": point["text"], "point": point_label(point)}
        for arm in ARMS:
            figure = analysis["arms"].get(arm)
            row[f"{ARM_NAMES[arm]} [95% t interval]"] = _with_ci(figure)
            row[f"{ARM_NAMES[arm]}, per seed"] = ", ".join(
                f"{value:.2f}" for _, value in sorted((figure or {}).get("per_seed", {}).items()))
        difference = analysis["difference"]
        rows.append(row | {"joint minus stopped [95% t interval]": _with_ci(difference), "sign-flip p": _p(difference["p"]),
                           "pairs": difference["n"]})
    return pd.DataFrame(rows)


def threshold_table(points: list[dict]) -> pd.DataFrame:
    """Endpoint 3's sensitivity: z over probe noise per arm at every tag threshold, one row per text, point and arm."""
    rows = []
    for point in points:
        for arm in ARMS:
            row = {}
            for threshold in TAG_THRESHOLDS:
                name = PRIMARY_Z_OVER_NOISE if threshold == 0.8 else f"z_over_noise_at_{threshold}"
                figure = point["endpoints"].get(name, {}).get("arms", {}).get(arm)
                row[f"tags at {threshold:g}"] = _with_ci(figure)
            if any(value != "n/a" for value in row.values()):
                rows.append({"text": point["text"], "point": point_label(point), "arm": ARM_NAMES[arm], **row})
    return pd.DataFrame(rows)


def recurrence_table(points: list[dict]) -> pd.DataFrame:
    """Endpoint 2: one row per text, point and arm (both readings), then the difference between arms."""
    rows = []
    for point in points:
        recurrence = point["recurrence"]
        for arm, figure in recurrence["arms"].items():
            rule, level = figure["pair_rule"], figure["seed_level"]
            rows.append({"text": point["text"], "point": point_label(point), "arm or difference": ARM_NAMES[arm],
                         "cross-seed r [pair interval]": _with_ci({"value": rule["r"], "ci": rule["r_ci"]}),
                         "null (95th percentile)": f"{rule['null_r']:.2f} ({rule['null_r_95']:.2f})",
                         "rule: reading": "recurs" if rule["recurs"] else "model-specific",
                         "[seed interval]": _with_ci({"value": level["r"], "ci": level["r_ci"]}),
                         "seed-level p": _p(level["p"]), "seed level: reading":
                             "recurs" if level["recurs"] else "model-specific", "seed pairs": str(level["num_pairs"])})
        if recurrence["difference"] is not None:
            rows.append({"text": point["text"], "point": point_label(point),
                         "arm or difference": "joint minus stopped", "[seed interval]": _with_ci(recurrence["difference"])})
    return pd.DataFrame(rows).fillna("")


def gradient_context(analysis: dict | None, markdown_table) -> dict | None:
    """What the template's section shows: the tables as Markdown and the final point's figures."""
    if analysis is None:
        return None
    points = analysis["points"]
    endpoints = [name for name in ENDPOINT_NAMES if any(name in point["endpoints"] for point in points)]
    final = {point["text"]: point for point in points if point["step"] == analysis["final_step"]}
    primary = final.get(analysis["primary_text"])
    r = primary["endpoints"].get("cross_fitted_r") if primary else None
    return {
        **analysis,
        "arm_names": ARM_NAMES,
        "endpoint_names": {name: ENDPOINT_NAMES[name] for name in endpoints},
        "arms_tables": {name: markdown_table(arms_table(points, name)) for name in endpoints},
        "threshold_table": markdown_table(threshold_table(points)) if PRIMARY_Z_OVER_NOISE in endpoints else None,
        "recurrence_table": markdown_table(recurrence_table(points)) if points else None,
        "final_label": point_label(primary) if primary else None,
        "final_r": None if r is None else {"difference": _with_ci(r["difference"]),
                                           **{arm: _with_ci(r["arms"].get(arm)) for arm in ARMS}},
        "null_permutations": NULL_PERMUTATIONS,
    }
