"""
The 2x2 of cooperation and embedding sharing (docs/study.md, "What causes the split: the 2x2, pre-registered"),
computed from the kept files alone: each scored point's per-half, per-type sums (type_sums.parquet).

Per run, text and trajectory point, the per-run endpoints (`PER_RUN_ENDPOINTS`; endpoint 1 is the cross-fitted r,
recomputed from the sums); per text and point, the seed-level linear model value ~ cooperation + embedding +
cooperation x embedding with effect coding (cooperative +1, shared embedding +1), each effect (a main effect: the
mean of its +1 cells minus the mean of its -1 cells; the interaction: the cooperation effect with a shared embedding
minus that with separate ones) with its t interval and two-sided p, and for the main effects the exact permutation
test that exchanges the factor's labels within each level of the other factor. Endpoint 2, per cell: the cross-seed
matched r of study_verdicts.cross_seed against its permutation null, and the same effects on it with bootstrap
intervals. Endpoint 3, where the scored texts' tags are given: each run's part-of-speech z (study/parts_of_speech.py)
in the same linear model, and per cell the sign of d after orienting each seed's towers to the first seed's.
"""

import dataclasses
import itertools
import json
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from twotower.training.arguments import load_config

from ..scoring.cross_fitting import NUM_HALVES, CrossFittedPreference
from ..scoring.report_files import TYPE_SUMS_PARQUET
from .cross_fit import t_interval
from .kept_tables import kept_tokenizer_file
from ..scoring.parts_of_speech_tagging import AGREEMENT_THRESHOLD
from .parts_of_speech import (
    cross_fitted_function_content_contrast, noise_only_contrast_z, seeds_function_content_contrast, tags_at,
)
from .verdicts import CONFIDENCE, RunTypes, cross_seed, interval, seed_level_recurrence
from ..tower_preference.preference_stats import tower_contrast

FACTORS = ("cooperation", "embedding")
FACTOR_OPTIONS = ("cooperative", "separate_embeddings")  # the training options that set them
EFFECTS = ("cooperation", "embedding", "interaction")
# each effect as a contrast of the linear model's coefficients (intercept, cooperation, embedding, interaction)
EFFECT_CONTRASTS = {"cooperation": [0, 2, 0, 0], "embedding": [0, 0, 2, 0], "interaction": [0, 0, 0, 4]}
SIGNIFICANCE = 1 - CONFIDENCE
CELL_NAMES = {(1, 1): "cooperative, shared embedding", (1, -1): "cooperative, separate embeddings",
              (-1, 1): "independent, shared embedding", (-1, -1): "independent, separate embeddings"}


def family_factors(study) -> dict[str, dict]:
    """
    Each family's coded factors: cooperation +1 (cooperative towers) or -1 (`cooperative: false`), embedding +1
    (one shared embedding) or -1 (`separate_embeddings: true`), read from its training options (recipe, study,
    family). Only families alike in everything else cross (one pretraining recipe, the same other overrides); empty
    unless such families fill all four cells.
    """
    groups = {}
    for name, family in study.families.items():
        options = {**dataclasses.asdict(load_config(family.pretrain_recipe)), **study.pretrain, **family.overrides}
        others = {key: value for key, value in family.overrides.items() if key not in FACTOR_OPTIONS}
        codes = {"cooperation": -1 if options.get("cooperative") is False else 1,
                 "embedding": -1 if options.get("separate_embeddings") else 1}
        groups.setdefault((family.pretrain_recipe, json.dumps(others, sort_keys=True)), {})[name] = codes
    for factors in groups.values():
        if len({(codes["cooperation"], codes["embedding"]) for codes in factors.values()}) == 4:
            return factors
    return {}


@dataclasses.dataclass
class KeptPoint:
    """One run's scored point on one text, as the report folder keeps it: what a per-run endpoint reads."""

    run_dir: Path  # the kept run folder (run.json, scores/, trajectory/; its tokenizer: kept_tokenizer_file)
    summary: dict  # run.json
    text: str
    step: int
    type_tags: dict | None = None  # {token id: UPOS} of the scored text for the run's tokenizer, where tagged
    type_tag_table: pd.DataFrame | None = None  # where given, the tags as kept (TypeTags.table()): any threshold

    @property
    def scores(self) -> dict:
        """run.json's figures of this point and text."""
        point = next(point for point in self.summary["trajectory"] if point["step"] == self.step)
        return point["scores"][self.text]

    @property
    def path(self) -> Path:
        last = self.summary["trajectory"][-1]["step"]
        point_dir = Path() if self.step == last else Path("trajectory", f"step-{self.step}")
        return self.run_dir / point_dir / "scores" / self.text / TYPE_SUMS_PARQUET

    @cached_property
    def type_sums(self) -> pd.DataFrame:
        return pd.read_parquet(self.path)

    @property
    def num_towers(self) -> int:
        return self.summary["run"]["num_towers"]

    @property
    def min_count(self) -> int:
        return self.scores["cross_fit"]["min_count"]

    @property
    def replicas_per_tower(self) -> int:
        probes = sum(column.startswith("logprob_sum_probe") for column in self.type_sums.columns)
        return probes // self.num_towers


def probe_sums(table: pd.DataFrame, num_towers: int):
    """(sum_logprob [halves, probes, vocab], count [halves, vocab]) of a type_sums table, tower-major probes."""
    probes = [column for column in table if column.startswith("logprob_sum_probe")]
    probes.sort(key=lambda column: int(column.removeprefix("logprob_sum_probe")))
    if len(probes) % num_towers:
        raise ValueError(f"{len(probes)} probe columns do not divide among {num_towers} towers.")
    vocab_size = int(table["token_id"].max()) + 1
    sum_logprob = np.zeros((NUM_HALVES, len(probes), vocab_size))
    count = np.zeros((NUM_HALVES, vocab_size), np.int64)
    for half, rows in table.groupby("half"):
        ids = rows["token_id"].to_numpy()
        count[half, ids] = rows["count"].to_numpy()
        sum_logprob[half][:, ids] = rows[probes].to_numpy().T
    return sum_logprob, count


def cross_fitted_r(point: KeptPoint) -> float | None:
    """Endpoint 1: the run's cross-fitted r, recomputed from its type sums with cross_fitting.py's own code."""
    sum_logprob, count = probe_sums(point.type_sums, point.num_towers)
    cross_fit = CrossFittedPreference(point.num_towers, sum_logprob.shape[1] // point.num_towers, count.shape[1])
    cross_fit.sum_logprob, cross_fit.count = sum_logprob, count
    return cross_fit.compute(min_count=point.min_count)["cross_fitted_r"]


def type_preferences(point: KeptPoint) -> RunTypes:
    """
    The run's per-type preference over both halves, as the scoring command centers it (each tower's replica-mean
    log-prob less the other towers', per occurrence, less its occurrence-weighted mean over all types), for the
    types seen at least min_count times: what the cross-seed correlation reads (two towers: tower 0's row).
    """
    sum_logprob, count = probe_sums(point.type_sums, point.num_towers)
    sum_logprob, count = sum_logprob.sum(axis=0), count.sum(axis=0)
    tower_sums = sum_logprob.reshape(point.num_towers, -1, count.size).mean(axis=1)  # [towers, vocab]
    sum_preference = tower_contrast(tower_sums)
    offset = sum_preference.sum(axis=1, keepdims=True) / count.sum()
    eligible = np.flatnonzero(count >= point.min_count)
    preference = sum_preference[:, eligible] / count[eligible] - offset
    rows = preference[:1] if point.num_towers == 2 else preference
    return RunTypes(name=point.run_dir.name, seed=point.summary["run"]["seed"], token_ids=eligible,
                    preference=rows, sampling_variance=np.zeros_like(rows), over_floor=np.zeros(eligible.size))


def point_contrast(point: KeptPoint, threshold: float = AGREEMENT_THRESHOLD, **options) -> dict | None:
    """The run's function-word against content-word contrast (parts_of_speech.cross_fitted_function_content_contrast)
    with the text's tags at `threshold`; None where the text is not tagged."""
    if point.type_tags is None and point.type_tag_table is None:
        return None
    tags = point.type_tags if point.type_tag_table is None else tags_at(point.type_tag_table, threshold)
    return cross_fitted_function_content_contrast(
        point.type_sums, tags, point.num_towers, point.replicas_per_tower, point.min_count, **options)


def part_of_speech_z(point: KeptPoint, remove_frequency_trend: bool = False) -> float | None:
    """Endpoint 3: the run's function-word against content-word contrast z (None where the text is not tagged)."""
    contrast = point_contrast(point, remove_frequency_trend=remove_frequency_trend)
    return None if contrast is None else contrast["z"]


def frequency_adjusted_part_of_speech_z(point: KeptPoint) -> float | None:
    """Not pre-registered: endpoint 3 after removing the preference's linear trend on the types' log count."""
    return part_of_speech_z(point, remove_frequency_trend=True)


def noise_only_z(point: KeptPoint, threshold: float = AGREEMENT_THRESHOLD) -> float | None:
    """The part-of-speech z of the run's probe noise alone (parts_of_speech.noise_only_contrast_z: each tower's
    replicas as two pseudo-towers); None where the text's kept tags are not given or the run has too few replicas
    per tower to split each cross-fitting group in two (fewer than 4)."""
    if point.type_tag_table is None or point.replicas_per_tower % 4:
        return None
    return noise_only_contrast_z(point.type_sums, tags_at(point.type_tag_table, threshold), point.num_towers,
                                 point.replicas_per_tower, point.min_count)


def z_over_noise(point: KeptPoint, threshold: float = AGREEMENT_THRESHOLD) -> float | None:
    """The run's part-of-speech z less its probe-noise-only z, both with the tags at `threshold`."""
    noise = noise_only_z(point, threshold)
    if noise is None:
        return None
    z = point_contrast(point, threshold)["z"]
    return None if z is None else z - noise


def part_of_speech_variance_share(point: KeptPoint) -> float | None:
    """The share of the run's per-type preference variance (function-word and content-word types) that the
    function/content label explains."""
    contrast = point_contrast(point)
    return None if contrast is None or contrast["z"] is None else contrast["variance_share"]


def ablation_agreement(point: KeptPoint) -> float | None:
    """The run's correlation of its mean-ablation preference with its probe preference, as its scoring wrote it."""
    return (point.scores.get("ablation") or {}).get("correlation_with_probe_preference")


def part_of_speech_signs(points: list[tuple[dict, KeptPoint]], z_per_run: dict) -> dict:
    """Per cell whose every run has a z (`z_per_run`, by run name), each seed's d after orienting its towers to the
    cell's first seed's, and their sign consistency."""
    signs = {}
    for cell, name in CELL_NAMES.items():
        members = sorted(((codes["seed"], point) for codes, point in points
                          if (codes["cooperation"], codes["embedding"]) == cell), key=lambda member: member[0])
        if not members or any(z_per_run[point.run_dir.name] is None for _, point in members):
            continue
        across = seeds_function_content_contrast([
            {"type_sums": point.type_sums, "type_tags": point.type_tags, "num_towers": point.num_towers,
             "replicas_per_tower": point.replicas_per_tower} for _, point in members
        ], min_count=members[0][1].min_count)
        signs[name] = {"d_nats": {seed: run["d_nats"] for (seed, _), run in zip(members, across["runs"])},
                       **across["sign_consistency"]}
    return signs


PART_OF_SPEECH_ENDPOINT = "part_of_speech_z"
FREQUENCY_ADJUSTED_ENDPOINT = "part_of_speech_z_frequency_adjusted"  # exploratory: function words are frequent
NOISE_ONLY_ENDPOINT = "noise_only_z"
Z_OVER_NOISE_ENDPOINT = "z_over_noise"
VARIANCE_SHARE_ENDPOINT = "part_of_speech_variance_share"
# endpoint 3 read against probe noise at other tag thresholds than the tagging's own (AGREEMENT_THRESHOLD)
TAG_THRESHOLDS = (0.6, 0.7, 0.8, 0.9, 0.95)
# per-run endpoints: name -> function of a KeptPoint returning the run's value (None when it has none); each enters
# the same linear model, and one that no run has is left out. After the pre-registered three, the readings the
# audit of the 2x2 asked for (docs/study.md): endpoint 3 against the same run's probe noise, and the share of the
# per-type variance the label explains.
PER_RUN_ENDPOINTS = {"cross_fitted_r": cross_fitted_r, PART_OF_SPEECH_ENDPOINT: part_of_speech_z,
                     FREQUENCY_ADJUSTED_ENDPOINT: frequency_adjusted_part_of_speech_z,
                     NOISE_ONLY_ENDPOINT: noise_only_z, Z_OVER_NOISE_ENDPOINT: z_over_noise,
                     VARIANCE_SHARE_ENDPOINT: part_of_speech_variance_share}


def effect_model(records: list[dict]) -> dict:
    """
    The linear model value ~ cooperation + embedding + cooperation x embedding (effect coding) over per-run records
    ({"cooperation": +-1, "embedding": +-1, "value": float}): each effect with its t interval and two-sided p
    (none when no residual degree of freedom is left), the residual degrees of freedom and the runs.
    """
    codes = np.array([[1, r["cooperation"], r["embedding"], r["cooperation"] * r["embedding"]] for r in records], float)
    values = np.array([r["value"] for r in records], float)
    if len({(r["cooperation"], r["embedding"]) for r in records}) < 4:
        return {"effects": None, "df": None, "n": len(records)}
    coefficients, *_ = np.linalg.lstsq(codes, values, rcond=None)
    df = len(values) - codes.shape[1]
    inverse = np.linalg.inv(codes.T @ codes)
    residual = values - codes @ coefficients
    effects = {}
    for name, contrast in EFFECT_CONTRASTS.items():
        contrast = np.asarray(contrast, float)
        estimate = float(contrast @ coefficients)
        effect = {"value": estimate, "ci": None, "p": None}
        if df > 0:
            se = float(np.sqrt(residual @ residual / df * contrast @ inverse @ contrast))
            half = stats.t.ppf(0.5 + CONFIDENCE / 2, df) * se
            p = float(2 * stats.t.sf(abs(estimate) / se, df)) if se > 0 else float(estimate == 0)
            effect |= {"ci": [estimate - half, estimate + half], "p": p}
        effects[name] = effect
    return {"effects": effects, "df": df, "n": len(values)}


def stratified_permutation_p(records: list[dict], factor: str) -> dict:
    """
    The exact two-sided permutation p of a main effect: every arrangement of the factor's labels within each level
    of the other factor (cell sizes kept), the effect recomputed; p is the share at least as far from 0.
    """
    other = FACTORS[1 - FACTORS.index(factor)]
    values = np.array([r["value"] for r in records], float)
    labels, strata = (np.array([r[name] for r in records]) for name in (factor, other))
    per_stratum = []  # per level of the other factor: the effect's half from every arrangement within it
    for level in (1, -1):
        members = np.flatnonzero(strata == level)
        positive = int((labels[members] == 1).sum())
        sums = np.array([values[list(chosen)].sum() for chosen in itertools.combinations(members, positive)])
        per_stratum.append((sums / positive - (values[members].sum() - sums) / (members.size - positive)) / 2)
    effects = np.add.outer(*per_stratum).ravel()
    observed = sum((values[(strata == level) & (labels == 1)].mean() - values[(strata == level) & (labels == -1)].mean())
                   / 2 for level in (1, -1))
    tolerance = 1e-12 * max(1.0, abs(observed))
    return {"p": float(np.mean(np.abs(effects) >= abs(observed) - tolerance)), "arrangements": int(effects.size)}


def cell_table(records: list[dict]) -> dict:
    """Per cell (named as in CELL_NAMES): mean and t interval over its seeds, and the per-seed values."""
    cells = {}
    for cell, name in CELL_NAMES.items():
        values = {r["seed"]: r["value"] for r in records if (r["cooperation"], r["embedding"]) == cell}
        cells[name] = t_interval(list(values.values())) | {"per_seed": values}
    return cells


def endpoint_analysis(records: list[dict]) -> dict:
    """One per-run endpoint at one text and point: the cells, the linear model, the permutation tests."""
    records = [r for r in records if r["value"] is not None]
    model = effect_model(records)
    if model["effects"] is not None:
        for factor in FACTORS:
            model["effects"][factor]["permutation"] = stratified_permutation_p(records, factor)
    return {"cells": cell_table(records), **model}


def cross_seed_cells(runs_by_cell: dict[tuple, list[RunTypes]]) -> dict:
    """
    Endpoint 2: per cell, the cross-seed matched r (study_verdicts.cross_seed) against its null, read two ways: the
    pre-registered rule (`recurs`: the interval from resampling seed pairs and types lies above the null's 95th
    percentile) and the seed-level permutation test (`seed_level`: the mean r against the same null, with an interval
    from resampling seeds); between cells, each effect of the 2x2 on it (cell weights as in the linear model) with
    the interval of the cells' seed-level bootstrap values.
    """
    cells, resamples = {}, {}
    for cell, name in CELL_NAMES.items():
        figure = cross_seed(runs_by_cell.get(cell, []))
        if figure is None:
            continue
        figure.pop("r_resamples")
        level = seed_level_recurrence(runs_by_cell[cell])
        resamples[cell] = level.pop("r_resamples")
        cells[name] = figure | {"seeds": sorted(run.seed for run in runs_by_cell[cell]),
                                "recurs": bool(figure["r_ci"][0] > figure["null_r_95"]),
                                "seed_level": level | {"recurs": level["p"] < SIGNIFICANCE}}
    if len(resamples) < 4:
        return {"cells": cells, "effects": None}
    weights = {"cooperation": lambda c, e: c / 2, "embedding": lambda c, e: e / 2, "interaction": lambda c, e: c * e}
    effects = {}
    for effect, weight in weights.items():
        value = sum(weight(*cell) * cells[CELL_NAMES[cell]]["r"] for cell in resamples)
        draws = sum(weight(*cell) * values for cell, values in resamples.items())
        effects[effect] = {"value": float(value), "ci": interval(draws[np.isfinite(draws)])}
    return {"cells": cells, "effects": effects}


def kept_points(summaries, runs_dir, factors, text, step, type_tag_table_of=None) -> list[tuple[dict, KeptPoint]]:
    """The runs of `factors` ({family: codes}) that keep type sums for `text` at `step`, with their codes and, where
    `type_tag_table_of(text, tokenizer_file)` gives it, the text's kept tags table."""
    points = []
    for summary in summaries:
        run = summary["run"]
        if run["family"] not in factors or step not in [point["step"] for point in summary["trajectory"]]:
            continue
        point = KeptPoint(runs_dir / run["name"], summary, text, step)
        if point.path.is_file():
            if type_tag_table_of is not None:
                point.type_tag_table = type_tag_table_of(text, kept_tokenizer_file(point.run_dir, summary))
                point.type_tags = None if point.type_tag_table is None else tags_at(point.type_tag_table)
            points.append((factors[run["family"]] | {"family": run["family"], "seed": run["seed"]}, point))
    return points


def point_analysis(points: list[tuple[dict, KeptPoint]], endpoints: dict) -> dict:
    """Every per-run endpoint's 2x2 analysis and endpoint 2's cells at one text and point."""
    analyses = {}
    for name, endpoint in endpoints.items():
        records = [codes | {"run": point.run_dir.name, "value": endpoint(point)} for codes, point in points]
        if all(r["value"] is None for r in records):
            continue
        analyses[name] = endpoint_analysis(records) | {"per_run": {r["run"]: r["value"] for r in records}}
    if PART_OF_SPEECH_ENDPOINT in analyses:
        pos = analyses[PART_OF_SPEECH_ENDPOINT]
        pos["signs"] = part_of_speech_signs(points, pos["per_run"])
    if Z_OVER_NOISE_ENDPOINT in analyses:  # its sensitivity to the tagging's threshold: the cells, no linear model
        by_threshold = {}
        for threshold in TAG_THRESHOLDS:
            records = [codes | {"value": z_over_noise(point, threshold)} for codes, point in points]
            by_threshold[threshold] = cell_table([r for r in records if r["value"] is not None])
        analyses[Z_OVER_NOISE_ENDPOINT]["cells_by_threshold"] = by_threshold
    runs_by_cell = {}
    for codes, point in points:
        runs_by_cell.setdefault((codes["cooperation"], codes["embedding"]), []).append(type_preferences(point))
    return {"endpoints": analyses, "cross_seed": cross_seed_cells(runs_by_cell)}


def factorial_analysis(summaries, runs_dir, study, endpoints=None, type_tag_table_of=None) -> dict | None:
    """
    The 2x2 from the kept runs (None unless the study's families cross the two factors): per text and trajectory
    point (`multiple`: the step over the first point's), each endpoint's analysis, and the pre-registered words.
    `type_tag_table_of(text, tokenizer_file)`: the kept tags table of a scored text (TypeTags.table(); None where
    not tagged), for endpoint 3.
    """
    factors = family_factors(study)
    runs = [summary for summary in summaries if summary["run"]["family"] in factors]
    if not runs:
        return None
    endpoints = PER_RUN_ENDPOINTS if endpoints is None else endpoints
    steps = sorted({point["step"] for summary in runs for point in summary["trajectory"]})
    results = []
    for text in study.eval_texts:
        for step in steps:
            points = kept_points(runs, runs_dir, factors, text, step, type_tag_table_of)
            if points:
                results.append({"text": text, "step": step, "multiple": step / steps[0],
                                **point_analysis(points, endpoints)})
    primary_text = next(iter(study.eval_texts))
    final = {result["text"]: result for result in results if result["step"] == steps[-1]}
    planned = sum(run.family in factors for run in study.runs())
    return {"factors": factors, "primary_text": primary_text, "final_step": steps[-1], "points": results,
            "runs_kept": len(runs), "runs_planned": planned,
            "verdict": factorial_verdict(final, primary_text) if len(runs) >= planned else INTERIM_VERDICT}


def _excludes_zero(effect) -> bool:
    return effect["ci"] is not None and (effect["ci"][0] > 0 or effect["ci"][1] < 0)


def explanation(effects_by_text: dict, primary_text: str) -> str:
    """
    Which explanation endpoint 1 supports (docs/study.md, decided before the data): "interaction" (its interval
    excludes 0 on the primary text: the cells are described instead), "cooperation" (its effect's interval above
    0 on the primary text and its estimate positive on every other text), "embedding sharing" (its effect's
    interval excludes 0 and cooperation's does not), "neither" (no interval excludes 0), otherwise "none of the
    pre-registered answers".
    """
    effects = effects_by_text[primary_text]
    if effects is None:
        return "too few runs"
    if _excludes_zero(effects["interaction"]):
        return "interaction"
    replications = [other for text, other in effects_by_text.items() if text != primary_text and other is not None]
    cooperation = effects["cooperation"]
    if cooperation["ci"] is not None and cooperation["ci"][0] > 0 and all(
            other["cooperation"]["value"] > 0 for other in replications):
        return "cooperation"
    if _excludes_zero(effects["embedding"]) and not _excludes_zero(cooperation):
        return "embedding sharing"
    if not any(_excludes_zero(effect) for effect in effects.values()):
        return "neither"
    return "none of the pre-registered answers"


def cooperative_mean(analysis: dict) -> dict:
    """An endpoint's mean over the seeds of both cooperative cells, with its t interval."""
    return t_interval([value for cell, figure in analysis["cells"].items() if cell.startswith("cooperative")
                       for value in figure["per_seed"].values()])


def syntax_reading(final: dict, name: str) -> str | None:
    """
    The paper's syntax/semantics reading on a per-run endpoint `name` (the part-of-speech z): "supported" when the
    cooperative cells' mean has a t interval over seeds above 0 on every text and the cooperation effect's estimate
    on it is positive on every text, else "not supported at this scale"; None without that endpoint.
    """
    if not final or any(name not in result["endpoints"] for result in final.values()):
        return None
    for result in final.values():
        analysis = result["endpoints"][name]
        mean = cooperative_mean(analysis)
        if mean["ci"] is None or mean["ci"][0] <= 0 or analysis["effects"] is None \
                or analysis["effects"]["cooperation"]["value"] <= 0:
            return "not supported at this scale"
    return "supported"


# Pre-registered (docs/study.md): no endpoint is read before every planned run is kept; until then the tables are interim.
INTERIM_VERDICT = {"explanation": "not read before every planned run is kept", "recurs": {},
                   "recurs_seed_level": {}, "syntax_reading": None, "part_of_speech": {}}


def cooperative_values(analysis: dict) -> list[float]:
    return [value for cell, figure in analysis["cells"].items() if cell.startswith("cooperative")
            for value in figure["per_seed"].values()]


def noise_reading(result: dict) -> dict | None:
    """
    Endpoint 3 against probe noise on one text (the audit's reading, after the pre-registered one): the cooperative
    cells' mean z over the same runs' noise-only z, whether its interval lies above 0, the tag thresholds at which
    it holds 0, and the share of the per-type variance the label explains (mean and largest over cooperative runs).
    """
    over_noise = result["endpoints"].get(Z_OVER_NOISE_ENDPOINT)
    if over_noise is None:
        return None
    mean = cooperative_mean(over_noise)
    holding_zero = [threshold for threshold, cells in over_noise["cells_by_threshold"].items()
                    if (figure := t_interval([v for cell, f in cells.items() if cell.startswith("cooperative")
                                              for v in f["per_seed"].values()]))["ci"] is None
                    or figure["ci"][0] <= 0]
    shares = cooperative_values(result["endpoints"][VARIANCE_SHARE_ENDPOINT])
    return {"cooperative_z_over_noise": mean,
            "cooperative_noise_only_z": cooperative_mean(result["endpoints"][NOISE_ONLY_ENDPOINT]),
            "beyond_noise": bool(mean["ci"] is not None and mean["ci"][0] > 0),
            "thresholds_holding_zero": holding_zero,
            "variance_share_mean": float(np.mean(shares)) if shares else None,
            "variance_share_max": float(np.max(shares)) if shares else None}


def factorial_verdict(final: dict, primary_text: str) -> dict:
    """The words of the final point: endpoint 1's explanation, endpoint 2's recurrence per cell and text (by the
    pre-registered rule and by the seed-level test), and, with the part-of-speech endpoint, the syntax/semantics
    reading and its figures per text (the cooperative cells' mean z, the cooperation effect on z, and, not
    pre-registered, the cooperative cells' mean z with the log-frequency trend removed and its reading against
    probe noise, `noise_reading`)."""
    adjusted = {text: result["endpoints"].get(FREQUENCY_ADJUSTED_ENDPOINT) for text, result in final.items()}
    return {
        "explanation": explanation({text: result["endpoints"]["cross_fitted_r"]["effects"]
                                    for text, result in final.items()}, primary_text) if primary_text in final else None,
        "recurs": {text: {cell: figure["recurs"] for cell, figure in result["cross_seed"]["cells"].items()}
                   for text, result in final.items()},
        "recurs_seed_level": {text: {cell: figure["seed_level"]["recurs"]
                                     for cell, figure in result["cross_seed"]["cells"].items()}
                              for text, result in final.items()},
        "syntax_reading": syntax_reading(final, PART_OF_SPEECH_ENDPOINT),
        "part_of_speech": {
            text: {"cooperative_z": cooperative_mean(analysis),
                   "cooperation_effect": (analysis["effects"] or {}).get("cooperation"),
                   "cooperative_z_frequency_adjusted": cooperative_mean(adjusted[text]) if adjusted[text] else None,
                   "against_noise": noise_reading(result)}
            for text, result in final.items() if (analysis := result["endpoints"].get(PART_OF_SPEECH_ENDPOINT))
        },
    }
