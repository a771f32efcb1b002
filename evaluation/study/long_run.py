"""
The long-run check (study recipe long.yaml): each family's cooperative and control run of one seed, followed along
its trajectory (probes and scoring at 1x, 2x, 4x and 8x the study's length). Per point: the validation loss and its
relative drop since the previous point (a doubling of training), each arm's replica-level reliability with its
bootstrap interval over token types (the scoring command's), their difference, each arm's cross-fitted
correlation and ablation agreement, and the words the difference allows.

With one seed the difference's interval combines the two arms' intervals as independent (half-widths added in
quadrature), the seed-to-seed spread not included; the cross-fitted figures have no interval.
"""

import math

import pandas as pd

from ..scoring.formatting import number, percent, with_interval
from .cross_fit import controls_of
from .verdicts import difference_conclusion


def _point_figures(point: dict, text: str) -> dict | None:
    scores = point["scores"].get(text)
    if scores is None:
        return None
    cross_fit, ablation = scores.get("cross_fit") or {}, scores.get("ablation") or {}
    return {
        "reliability": scores["reliability"],
        "reliability_ci": scores["reliability_ci"],
        "cross_fitted_r": cross_fit.get("cross_fitted_r"),
        "ablation_r": ablation.get("correlation_with_probe_preference"),
        "validation_loss": (point["pretrain_validation"] or {}).get("loss"),
    }


def difference_interval(first: dict, second: dict) -> tuple[float, list[float]] | tuple[None, None]:
    """First's reliability minus second's, the interval's half-widths added in quadrature (independent arms)."""
    if None in (first["reliability"], second["reliability"]) or None in (*first["reliability_ci"],
                                                                        *second["reliability_ci"]):
        return None, None
    difference = first["reliability"] - second["reliability"]
    half = math.hypot(*((ci[1] - ci[0]) / 2 for ci in (first["reliability_ci"], second["reliability_ci"])))
    return difference, [difference - half, difference + half]


def point_conclusion(difference_ci, control_ci) -> str:
    """The study's words for one trajectory point (verdicts.py's rule; no floor test here)."""
    if difference_ci is None:
        return "n/a"
    return difference_conclusion(difference_ci, control_ci) or "no difference shown"


PENDING = "control not scored yet"
NO_FIGURES = dict.fromkeys(("reliability", "cross_fitted_r", "ablation_r", "validation_loss")) | {
    "reliability_ci": [None, None]
}


def long_run_rows(summaries: list[dict], text: str, study) -> list[dict]:
    """One row per cooperative family, seed and trajectory step; the control's figures are None (and the words
    PENDING) where the control has not reached that step."""
    runs = {(summary["run"]["family"], summary["run"]["seed"]): summary for summary in summaries}
    rows = []
    for (family, seed), summary in sorted(runs.items()):
        if study.families[family].control_of is not None:
            continue
        control = next(iter(controls_of(study, family)), None)
        control_run = runs.get((control, seed), {"trajectory": []})
        control_points = {point["step"]: point for point in control_run["trajectory"]}
        first_step, previous_loss = summary["trajectory"][0]["step"], None
        for point in summary["trajectory"]:
            cooperative = _point_figures(point, text)
            if cooperative is None:
                continue
            control_point = control_points.get(point["step"])
            independent = (control_point and _point_figures(control_point, text)) or NO_FIGURES
            difference, difference_ci = difference_interval(cooperative, independent)
            loss = cooperative["validation_loss"]
            rows.append({
                "family": family, "control": control, "seed": seed, "step": point["step"],
                "multiple": point["step"] / first_step,
                "validation_loss": loss,
                "relative_drop": None if previous_loss is None or loss is None else (previous_loss - loss) / previous_loss,
                "control_validation_loss": independent["validation_loss"],
                "reliability": cooperative["reliability"], "reliability_ci": cooperative["reliability_ci"],
                "control_reliability": independent["reliability"],
                "control_reliability_ci": independent["reliability_ci"],
                "difference": difference, "difference_ci": difference_ci,
                "cross_fitted_r": cooperative["cross_fitted_r"], "control_cross_fitted_r": independent["cross_fitted_r"],
                "ablation_r": cooperative["ablation_r"], "control_ablation_r": independent["ablation_r"],
                "conclusion": (PENDING if independent is NO_FIGURES
                               else point_conclusion(difference_ci, independent["reliability_ci"])),
            })
            previous_loss = loss
    return rows


def long_run_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "family": row["family"], "seed": row["seed"], "step": row["step"], "x": f"{row['multiple']:g}",
        "validation loss": number(row["validation_loss"]),
        "drop since last": "" if row["relative_drop"] is None else percent(row["relative_drop"]),
        "reliability": with_interval(row["reliability"], row["reliability_ci"]),
        "control reliability": with_interval(row["control_reliability"], row["control_reliability_ci"]),
        "difference": with_interval(row["difference"], row["difference_ci"]),
        "cross-fitted r": f"{number(row['cross_fitted_r'], 2)} / {number(row['control_cross_fitted_r'], 2)}",
        "ablation vs probe r": f"{number(row['ablation_r'], 2)} / {number(row['control_ablation_r'], 2)}",
        "verdict": row["conclusion"],
    } for row in rows])
