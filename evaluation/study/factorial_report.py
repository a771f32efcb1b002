"""
The 2x2's tables for the study document (templates/study_factorial.md.j2): per text and trajectory point, each cell's
mean over seeds with its t interval, each effect with its interval, p and permutation p, and endpoint 2's cells.
"""

import pandas as pd

from ..scoring.parts_of_speech_tagging import INSTALL_HINT
from .factorial import (
    CELL_NAMES, EFFECTS, FREQUENCY_ADJUSTED_ENDPOINT, NOISE_ONLY_ENDPOINT, PART_OF_SPEECH_ENDPOINT, TAG_THRESHOLDS,
    VARIANCE_SHARE_ENDPOINT, Z_OVER_NOISE_ENDPOINT,
)
from .verdicts import NULL_PERMUTATIONS

ENDPOINT_NAMES = {"cross_fitted_r": "cross-fitted r", PART_OF_SPEECH_ENDPOINT: "part-of-speech z",
                  FREQUENCY_ADJUSTED_ENDPOINT: "part-of-speech z, log-frequency trend removed (not pre-registered)",
                  NOISE_ONLY_ENDPOINT: "part-of-speech z of probe noise alone (not pre-registered)",
                  Z_OVER_NOISE_ENDPOINT: "part-of-speech z over probe noise (not pre-registered)",
                  VARIANCE_SHARE_ENDPOINT: "share of the per-type variance the function/content label explains "
                                           "(not pre-registered)"}


def _with_ci(figure: dict, digits: int = 2) -> str:
    if figure is None or figure.get("value") is None:
        return "n/a"
    if figure.get("ci") is None:
        return f"{figure['value']:.{digits}f}"
    return f"{figure['value']:.{digits}f} [{figure['ci'][0]:.{digits}f}, {figure['ci'][1]:.{digits}f}]"


def _p(value) -> str:
    return "n/a" if value is None else f"{value:.3f}" if value >= 0.001 else f"{value:.1e}"


def point_label(point: dict) -> str:
    return f"{point['multiple']:g}x ({point['step']:,} steps)"


def cells_table(points: list[dict], endpoint: str) -> pd.DataFrame:
    """One row per text, point and cell: the endpoint's mean over seeds with its t interval, and each seed's value."""
    rows = []
    for point in points:
        analysis = point["endpoints"].get(endpoint)
        if analysis is None:
            continue
        for cell in CELL_NAMES.values():
            figure = analysis["cells"][cell]
            rows.append({"text": point["text"], "point": point_label(point), "cell": cell, "seeds": figure["n"],
                         "mean [95% t interval]": _with_ci(figure),
                         "per seed": ", ".join(f"{value:.2f}" for value in figure["per_seed"].values())})
    return pd.DataFrame(rows)


def effects_table(points: list[dict], endpoint: str) -> pd.DataFrame:
    """One row per text, point and effect of the linear model on one per-run endpoint."""
    rows = []
    for point in points:
        analysis = point["endpoints"].get(endpoint)
        if analysis is None or analysis["effects"] is None:
            continue
        for effect in EFFECTS:
            figure = analysis["effects"][effect]
            permutation = figure.get("permutation")
            rows.append({"text": point["text"], "point": point_label(point), "effect": effect,
                         "estimate [95% t interval]": _with_ci(figure), "p": _p(figure["p"]),
                         "permutation p": "" if permutation is None else
                         f"{_p(permutation['p'])} ({permutation['arrangements']:,} arrangements)",
                         "residual df": analysis["df"]})
    return pd.DataFrame(rows)


def cross_seed_table(points: list[dict]) -> pd.DataFrame:
    """Endpoint 2: one row per text, point and cell, read by the pre-registered rule and by the seed-level test, then
    its effects (cells' seed-level bootstrap values combined)."""
    rows = []
    for point in points:
        figures = point["cross_seed"]
        for cell, figure in figures["cells"].items():
            level = figure["seed_level"]
            rows.append({"text": point["text"], "point": point_label(point), "cell or effect": cell,
                         "cross-seed r [pair interval]": _with_ci({"value": figure["r"], "ci": figure["r_ci"]}),
                         "null (95th percentile)": f"{figure['null_r']:.2f} ({figure['null_r_95']:.2f})",
                         "rule: reading": "recurs across models" if figure["recurs"] else "model-specific",
                         "[seed interval]": _with_ci({"value": level["r"], "ci": level["r_ci"]}),
                         "seed-level p": _p(level["p"]),
                         "seed level: reading": "recurs across models" if level["recurs"] else "model-specific"})
        for effect, figure in (figures["effects"] or {}).items():
            rows.append({"text": point["text"], "point": point_label(point), "cell or effect": f"effect: {effect}",
                         "cross-seed r [pair interval]": "", "null (95th percentile)": "", "rule: reading": "",
                         "[seed interval]": _with_ci(figure), "seed-level p": "", "seed level: reading": ""})
    return pd.DataFrame(rows)


def threshold_table(points: list[dict]) -> pd.DataFrame:
    """Endpoint 3 over probe noise at every tag threshold: one row per text, point and cell."""
    rows = []
    for point in points:
        analysis = point["endpoints"].get(Z_OVER_NOISE_ENDPOINT)
        if analysis is None:
            continue
        for cell in CELL_NAMES.values():
            rows.append({"text": point["text"], "point": point_label(point), "cell": cell,
                         **{f"tags at {threshold:g}": _with_ci(analysis["cells_by_threshold"][threshold][cell])
                            for threshold in TAG_THRESHOLDS}})
    return pd.DataFrame(rows)


def signs_table(points: list[dict]) -> pd.DataFrame:
    """Endpoint 3's sign: one row per text, point and cell, each seed's d after orienting its towers to the first
    seed's, and how many agree in sign."""
    rows = []
    for point in points:
        analysis = point["endpoints"].get(PART_OF_SPEECH_ENDPOINT)
        for cell, figure in (analysis or {}).get("signs", {}).items():
            rows.append({"text": point["text"], "point": point_label(point), "cell": cell,
                         "d per seed (nats, oriented)": ", ".join(f"{d:+.3f}" for d in figure["d_nats"].values()),
                         "same sign": f"{max(figure['num_positive'], figure['num_negative'])} of {figure['num_runs']}",
                         "sign test p": _p(figure["sign_test_p"])})
    return pd.DataFrame(rows)


def noise_words(reading: dict) -> dict:
    """The reading against probe noise (factorial.noise_reading) as the document writes it."""
    return {"z_over_noise": _with_ci(reading["cooperative_z_over_noise"]),
            "noise_only_z": _with_ci(reading["cooperative_noise_only_z"]),
            "beyond_noise": reading["beyond_noise"],
            "thresholds_holding_zero": ", ".join(f"{threshold:g}" for threshold in reading["thresholds_holding_zero"]),
            "variance_share_mean": f"{100 * reading['variance_share_mean']:.0f}%",
            "variance_share_max": f"{100 * reading['variance_share_max']:.0f}%"}


def factorial_context(factorial: dict | None, markdown_table) -> dict | None:
    """What the template's 2x2 section shows: tables as Markdown, the final point's effects and words."""
    if factorial is None:
        return None
    points = factorial["points"]
    endpoints = list(points[0]["endpoints"]) if points else []
    final = {point["text"]: point for point in points if point["step"] == factorial["final_step"]}
    return {
        **factorial,
        "endpoint_names": {name: ENDPOINT_NAMES.get(name, name) for name in endpoints},
        "cells_tables": {name: markdown_table(cells_table(points, name)) for name in endpoints},
        "effects_tables": {name: markdown_table(effects_table(points, name)) for name in endpoints},
        "cross_seed_table": markdown_table(cross_seed_table(points)) if points else None,
        "final_effects": {text: {effect: _with_ci(figure) for effect, figure in
                                 (point["endpoints"]["cross_fitted_r"]["effects"] or {}).items()}
                          for text, point in final.items()},
        "final_label": point_label(final[factorial["primary_text"]]) if factorial["primary_text"] in final else None,
        "signs_table": markdown_table(signs_table(points)) if PART_OF_SPEECH_ENDPOINT in endpoints else None,
        "threshold_table": markdown_table(threshold_table(points)) if Z_OVER_NOISE_ENDPOINT in endpoints else None,
        "null_permutations": NULL_PERMUTATIONS,
        "syntax": {text: {name: _with_ci(figure) if figure else "n/a" for name, figure in figures.items()
                          if name != "against_noise"} for text, figures in factorial["verdict"]["part_of_speech"].items()},
        "against_noise": {text: noise_words(figures["against_noise"])
                          for text, figures in factorial["verdict"]["part_of_speech"].items()
                          if figures.get("against_noise")},
        "install_hint": INSTALL_HINT,
    }
