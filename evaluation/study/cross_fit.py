"""
The study's cross-fitted verdicts: per family and text, the cross-fitted correlation of each run (probe replicas on
disjoint training slices, scored on alternate halves of the text's documents; scoring/cross_fitting.py) and the
agreement of the probe-free ablation preference with the probe preference (scoring/ablation.py), each over the
seeds with a t interval (the seed is the unit: with 3 seeds these are wide, and say so), for the cooperative towers,
their independent-towers control and the difference of the two, paired by seed.

The verdict says what was shown. "Emerges from cooperation" needs the control's cross-fitted correlation near 0
(its interval below NEAR_ZERO_R); otherwise a positive difference reads "cooperative towers differ more
reproducibly than independent ones". Pearson's r ignores a constant offset, so a tower that is better at every type
(the masked family's dominant tower) does not enter it; the offsets are reported beside it.
"""

import json

import numpy as np
import pandas as pd
from scipy import stats

from modeling_twotower.configuration_twotower import PRESETS
from twotower.training.arguments import load_config

from ..scoring.formatting import number, with_interval
from ..scoring.report import PREFERENCE_JSON, tower_columns
from ..tower_preference.measures import PROBE_FREE_MEASURES
from .kept_tables import load_kept_report
from .verdicts import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, CONFIDENCE, interval

NEAR_ZERO_R = 0.1  # a cross-fitted r whose interval stays below this is "near 0": no reproducible preference
CROSS_FIT_KEYS = ("cross_fitted_r", "same_probes_other_text_r", "other_probes_same_text_r")


def t_interval(values) -> dict:
    """Mean and two-sided CONFIDENCE t interval over `values` (seeds); no interval from fewer than 2."""
    values = np.asarray([value for value in values if value is not None], dtype=float)
    if values.size == 0:
        return {"value": None, "ci": None, "n": 0}
    if values.size == 1:
        return {"value": float(values[0]), "ci": None, "n": 1}
    # the half-width by hand: scipy's t.interval gives NaN for seeds that agree exactly (a zero scale)
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, values.size - 1) * stats.sem(values)
    return {"value": float(values.mean()), "ci": [float(values.mean() - half), float(values.mean() + half)],
            "n": int(values.size)}


def ablation_agreement(score_folder, rng, name="ablation") -> dict | None:
    """One run's correlation of a probe-free measure's preference (the mean ablation's by default; `name`, a
    registered measure's) with the probe preference over its eligible types, with a bootstrap interval over the
    types; None for a report without the measure's columns."""
    table = load_kept_report(score_folder).table
    if f"{name}_preference_nats_tower0" not in table:
        return None
    eligible = table[table["eligible"]]
    probe = tower_columns(eligible, "preference_nats")[0]
    ablation = tower_columns(eligible, f"{name}_preference_nats")[0]
    draws = rng.integers(0, probe.size, (BOOTSTRAP_RESAMPLES, probe.size))
    resampled = [np.corrcoef(probe[draw], ablation[draw])[0, 1] for draw in draws]
    return {"r": float(np.corrcoef(probe, ablation)[0, 1]), "ci": interval(resampled), "num_types": int(probe.size)}


def run_figures(score_folder, rng) -> dict:
    """What the cross-fitted verdict reads of one run's report on one text."""
    report = json.loads((score_folder / PREFERENCE_JSON).read_text())
    cross_fit = report.get("cross_fit") or {}
    return {
        **{key: cross_fit.get(key) for key in CROSS_FIT_KEYS},
        "cross_fit_types": cross_fit.get("num_types"),
        "probe_replica_data": cross_fit.get("probe_replica_data"),
        "global_offset_nats": report["summary"]["global_offset_nats"][0],
        # each probe-free measure's agreement with the probes (in the registry's order: the draws are the rng's next)
        **{measure.name: ablation_agreement(score_folder, rng, measure.name) for measure in PROBE_FREE_MEASURES},
        **{f"{measure.name}_mean_increase_nats": (report.get(measure.name) or {}).get("mean_increase_nats")
           for measure in PROBE_FREE_MEASURES},
    }


def arm_figures(runs: dict[int, dict]) -> dict:
    """One arm (cooperative or control) over its seeds: each figure's mean and t interval, and the per-seed values."""
    seeds = sorted(runs)
    ablation = [runs[seed]["ablation"] for seed in seeds]
    return {
        "seeds": seeds,
        **{key: t_interval([runs[seed][key] for seed in seeds]) | {"per_seed": [runs[seed][key] for seed in seeds]}
           for key in CROSS_FIT_KEYS},
        "global_offset_nats": [runs[seed]["global_offset_nats"] for seed in seeds],
        "ablation_r": ablation_over_seeds(ablation) | {"per_seed": ablation},
    }


def ablation_over_seeds(per_seed: list[dict | None]) -> dict:
    """The ablation agreement's mean and t interval over seeds; from one seed, that run's bootstrap interval over its
    types instead (narrower: it holds the types' sampling, not the seeds')."""
    figure = t_interval([None if a is None else a["r"] for a in per_seed])
    runs = [a for a in per_seed if a is not None]
    if figure["n"] == 1 and runs[0]["ci"] is not None:
        return figure | {"ci": runs[0]["ci"], "over": "types"}
    return figure


def paired_difference(cooperative: dict[int, dict], control: dict[int, dict], key: str) -> dict:
    """The cooperative minus the control figure, seed by seed (the seeds both arms have), with its t interval."""
    seeds = sorted(set(cooperative) & set(control))
    differences = [cooperative[s][key] - control[s][key] for s in seeds
                   if cooperative[s][key] is not None and control[s][key] is not None]
    return t_interval(differences) | {"seeds": seeds}


def cross_fit_conclusion(verdict: dict) -> str:
    """The words the intervals allow (see the module docstring)."""
    cooperative, control, difference = verdict["cooperative"], verdict["control"], verdict["difference"]
    ci = cooperative["cross_fitted_r"]["ci"]
    if ci is None:
        return "too few seeds for an interval"
    if ci[0] <= 0:
        return "no reproducible preference"
    if control is None:
        return "reproducible preference (no control)"
    if difference["ci"] is None:
        return "too few paired seeds for an interval"
    low, high = difference["ci"]
    control_ci = control["cross_fitted_r"]["ci"]
    if low > 0:
        if control_ci is not None and control_ci[1] < NEAR_ZERO_R:
            return "emerges from cooperation"
        return "cooperative towers differ more reproducibly than independent ones"
    if high < 0:
        return "independent towers differ more reproducibly than cooperative ones"
    return "no difference shown between cooperative and independent towers"


def cross_fit_figures(summaries, runs_dir, text) -> dict[str, dict[int, dict]]:
    """Per family and seed, the cross-fitted figures of its run on `text` (probe replicas on disjoint slices only:
    replicas that shared their training text are not cross-fitted)."""
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    figures = {}
    for summary in summaries:
        run = summary["run"]
        folder = runs_dir / run["name"] / "scores" / text
        if text in summary["scores"] and (folder / PREFERENCE_JSON).is_file():
            figures_of_run = run_figures(folder, rng)
            if figures_of_run["probe_replica_data"] == "disjoint":
                figures.setdefault(run["family"], {})[run["seed"]] = figures_of_run
    return figures


def _ablation_r(runs: dict[int, dict]) -> dict[int, dict]:
    return {seed: {"r": None if run["ablation"] is None else run["ablation"]["r"]} for seed, run in runs.items()}


def compare_arms(runs: dict[int, dict], control_runs: dict[int, dict] | None) -> dict:
    """Both arms' figures, the cross-fitted difference and the ablation agreement's, paired by seed."""
    return {
        "cooperative": arm_figures(runs),
        "control": arm_figures(control_runs) if control_runs else None,
        "difference": paired_difference(runs, control_runs, "cross_fitted_r") if control_runs else None,
        "ablation_difference": paired_difference(_ablation_r(runs), _ablation_r(control_runs), "r")
        if control_runs else None,
    }


def controls_of(study, family: str) -> list[str]:
    """The family's independent-towers controls, in the recipe's order (the first is its verdict's)."""
    return [name for name, spec in study.families.items() if spec.control_of == family]


def cross_fit_verdicts(summaries, runs_dir, text, study) -> dict:
    """Per cooperative family with cross-fitted runs on `text`: both arms' figures against its first control, the
    difference, the words."""
    figures = cross_fit_figures(summaries, runs_dir, text)
    verdicts = {}
    for name, family in study.families.items():
        runs = figures.get(name)
        if family.control_of is not None or not runs or all(r["cross_fitted_r"] is None for r in runs.values()):
            continue
        control_name, *other_controls = controls_of(study, name) or [None]
        control_runs = figures.get(control_name)
        verdict = {"control_family": control_name if control_runs else None, **compare_arms(runs, control_runs)}
        verdict["conclusion"] = cross_fit_conclusion(verdict)
        # further controls (e.g. towers that share no embedding either): each compared the same way
        verdict["other_controls"] = {}
        for other in other_controls:
            if other in figures:
                comparison = compare_arms(runs, figures[other])
                verdict["other_controls"][other] = comparison | {"conclusion": cross_fit_conclusion(comparison)}
        verdicts[name] = verdict
    return verdicts


def size_grid_rows(summaries, runs_dir, text, study) -> list[dict]:
    """Every cooperative family against each of its controls: the cross-fitted r of both arms and their gap, paired
    by seed, with the family's width and length (the size grid)."""
    figures = cross_fit_figures(summaries, runs_dir, text)
    rows = []
    for name, family in study.families.items():
        if family.control_of is not None or name not in figures:
            continue
        for control in controls_of(study, name):
            if control not in figures:
                continue
            comparison = compare_arms(figures[name], figures[control])
            rows.append({"family": name, "control_family": control, **family_size(study, name),
                         "separate_embeddings": bool(study.families[control].overrides.get("separate_embeddings")),
                         **comparison})
    return rows


def family_size(study, family: str) -> dict:
    """
    The tower width, depth, layout and pretraining steps of a family's runs (its overrides over the study's and its
    recipe's, then the recipe's preset).
    """
    spec = study.families[family]
    config = load_config(spec.pretrain_recipe)
    options = {**study.pretrain, **spec.overrides}
    preset = PRESETS[config.model_preset]

    def option(name):
        return options.get(name) or getattr(config, name, None) or preset.get(name)

    return {"hidden_size": option("hidden_size"), "num_hidden_layers": option("num_hidden_layers"),
            "layout": option("layout") or "bert",  # TwoTowerConfig's default
            "max_train_steps": options.get("max_train_steps", config.max_train_steps)}


def size_grid_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "width": row["hidden_size"], "layers": row["num_hidden_layers"], "layout": row["layout"],
        "steps": row["max_train_steps"], "family": row["family"],
        "control": row["control_family"] + (" (separate embeddings)" if row["separate_embeddings"] else ""),
        "seeds": ", ".join(str(seed) for seed in row["difference"]["seeds"]),
        "cooperative r": _with_ci(row["cooperative"]["cross_fitted_r"]),
        "control r": _with_ci(row["control"]["cross_fitted_r"]),
        "gap": _with_ci(row["difference"]),
        "ablation agreement gap": _with_ci(row["ablation_difference"]),
    } for row in rows])


def _with_ci(figure: dict | None) -> str:
    """A figure ({"value", "ci", "over"?}) with its interval, two decimals."""
    if figure is None:
        return "n/a"
    return with_interval(figure["value"], figure["ci"], 2, over_types=figure.get("over") == "types")


def cross_fit_summary_lines(verdicts: dict) -> list[str]:
    """One Markdown line per family: the cross-fitted verdict with its figures."""
    lines = []
    for family, verdict in verdicts.items():
        cooperative, control = verdict["cooperative"], verdict["control"]
        seeds = len(cooperative["seeds"])
        line = (f"- **{family}** ({seeds} seed{'s' if seeds != 1 else ''}): *{verdict['conclusion']}*; cross-fitted "
                f"r {_with_ci(cooperative['cross_fitted_r'])}")
        if control is not None:
            line += (f" vs {_with_ci(control['cross_fitted_r'])} for independent towers (difference "
                     f"{_with_ci(verdict['difference'])})")
        for other, comparison in verdict.get("other_controls", {}).items():
            line += (f"; against `{other}`: *{comparison['conclusion']}*, r {_with_ci(comparison['control']['cross_fitted_r'])}"
                     f" (difference {_with_ci(comparison['difference'])})")
        line += f"; ablation against probe preference r {_with_ci(cooperative['ablation_r'])}"
        if control is not None:
            line += f" (control {_with_ci(control['ablation_r'])})"
        lines.append(line + ".")
    return lines


def cross_fit_table(verdicts: dict) -> pd.DataFrame:
    """One row per family and arm: the three correlations, the ablation agreement and the offsets, per seed too."""
    rows = []
    for family, verdict in verdicts.items():
        arms = [(family, verdict["cooperative"])]
        if verdict["control"] is not None:
            arms.append((verdict["control_family"], verdict["control"]))
        arms += [(other, comparison["control"]) for other, comparison in verdict.get("other_controls", {}).items()]
        for name, arm in arms:
            rows.append({
                "family": name,
                "seeds": len(arm["seeds"]),
                "cross-fitted r": _with_ci(arm["cross_fitted_r"]),
                "per seed": ", ".join(
                    number(value, 2) for value in arm["cross_fitted_r"]["per_seed"] if value is not None
                ),
                "same probes, other half": _with_ci(arm["same_probes_other_text_r"]),
                "other probes, same half": _with_ci(arm["other_probes_same_text_r"]),
                "ablation vs probe r": _with_ci(arm["ablation_r"]),
                "offset tower 0 (nats)": ", ".join(f"{value:+.2f}" for value in arm["global_offset_nats"]),
            })
    return pd.DataFrame(rows)
