"""
Recompute a tower preference study's figures from its kept Parquet tables alone, with numpy, scipy and pandas (with
pyarrow to read Parquet), and no import of the twotower package: a second implementation of every figure a verdict
of the 2x2 (causes.yaml) or of the joint-gradient experiment (gradient.yaml) reads, written from docs/study.md's
definitions.

Per run, point and text: the cross-fitted r; where the study kept the scored text's tags, the part-of-speech z (and
the same with the types' log-frequency trend removed), the z of the run's probe noise alone and the z over it at
every tag threshold, the share of the per-type variance the function/content label explains, and d; where the run
kept the mean-ablation sums, the ablation agreement (its correlation with the probe preference). Per text and
point: each endpoint's cells (2x2) or arms (joint-gradient experiment) with their means over seeds and 95% t
intervals; the 2x2's effects (effect-coded linear model, t intervals, two-sided p) and the pooled cooperative means;
the arms' paired differences with the exact sign-flip p; per cell or arm the cross-seed matched r (the mean over seed
pairs, and each pair's) and, per cell, the sign of d after orienting each seed's towers to the first seed's. The
random parts of the documents (bootstrap intervals and permutation nulls of the cross-seed r) are not redrawn here.

    python scripts/recompute_study.py docs/study/causes          # a table to read
    python scripts/recompute_study.py docs/study/causes --json   # every figure, unrounded

Reads REPORT_DIR/run_index.parquet (one row per run, point and text) and each row's type_sums.parquet (per half and
token type: count, logprob_sum_probe{k} with probe k = tower * replicas + replica) and, where it names them, the
text's tags (type_tags/*.parquet: token_id, tag, tagged). Each table is checked as it is read: one that does not
read, lacks a column the figures need or holds a NaN or infinite number is named, and nothing is recomputed.
"""

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

CONFIDENCE = 0.95
CELLS = {(1, 1): "cooperative, shared embedding", (1, -1): "cooperative, separate embeddings",
         (-1, 1): "independent, shared embedding", (-1, -1): "independent, separate embeddings"}
EFFECTS = {"cooperation": [0, 2, 0, 0], "embedding": [0, 0, 2, 0], "interaction": [0, 0, 0, 4]}
# endpoint 3 (docs/study.md): Universal Dependencies tags of function words and of content words
FUNCTION_TAGS = ("DET", "ADP", "PRON", "AUX", "CCONJ", "SCONJ", "PART")
CONTENT_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "PROPN")
PERMUTATIONS = 1000
# the columns each kept table must have for the figures, and must hold as finite numbers (the study writes no NaN)
INDEX_COLUMNS = ("run", "seed", "text", "step", "num_towers", "min_count", "cooperative", "separate_embeddings", "path")
THRESHOLDS = (0.6, 0.7, 0.8, 0.9, 0.95)  # the share of a type's occurrences its majority tag needs; 0.8 the tagging's
PRIMARY_THRESHOLD = 0.8
SUMS_COLUMNS = ("half", "token_id", "count", "logprob_sum_probe0")
TAGS_COLUMNS = ("token_id", "tag", "agreement", "tagged")


class KeptTableError(ValueError):
    """A kept table the figures cannot be recomputed from."""


class ArchivedTablesError(KeptTableError):
    """Tables the index names that the working tree lacks (archived: written back by scripts/convert_kept_runs.py)."""


def read_kept_table(path: Path, columns) -> pd.DataFrame:
    """A kept Parquet table with `columns`, its numbers finite; else KeptTableError naming the file."""
    try:
        table = pd.read_parquet(path)
    except Exception as error:  # noqa: BLE001 (pyarrow's errors have no common base but Exception)
        raise KeptTableError(f"{path} cannot be read ({' '.join(str(error).split())})") from error
    # kept sums are float32 (exact enough: evaluation/scoring/type_sums.py); the figures are computed in float64
    table = table.astype({column: "float64" for column in table.select_dtypes("float32").columns})
    missing = [column for column in columns if column not in table.columns]
    numbers = table.select_dtypes("number")
    not_finite = [column for column in numbers if not np.isfinite(numbers[column].to_numpy(np.float64)).all()]
    if missing:
        raise KeptTableError(f"{path} lacks the column(s) {missing} (it holds {list(table.columns)})")
    if not_finite and not set(not_finite) <= {"cross_fitted_r"}:  # the index's r: none where a point was not cross-fit
        raise KeptTableError(f"{path} holds NaN or infinite values in {not_finite}, which the study never writes")
    return table


def half_means(sums: pd.DataFrame, num_towers: int):
    """(mean log-prob [halves, towers, replicas, types], eligible counts) over the types seen in both halves."""
    probes = sorted((c for c in sums if c.startswith("logprob_sum_probe")), key=lambda c: int(c[17:]))
    wide = sums.pivot(index="token_id", columns="half", values=["count", *probes]).fillna(0)
    count = np.stack([wide[("count", half)].to_numpy() for half in (0, 1)])  # [halves, types]
    logprob = np.stack([[wide[(probe, half)].to_numpy() for probe in probes] for half in (0, 1)])
    replicas = len(probes) // num_towers
    return logprob.reshape(2, num_towers, replicas, -1), count


def group_preferences(sums: pd.DataFrame, num_towers: int, min_count: int):
    """(token ids of the types seen min_count times in each half, {(half, group): [types, towers]}): replica group 0
    (replicas 0..R/2-1) and group 1 (the rest), each tower's per-type mean log-prob centered over types, then over
    towers."""
    logprob, count = half_means(sums, num_towers)
    eligible = (count >= min_count).all(axis=0)
    split = logprob.shape[2] // 2
    groups = [slice(0, split), slice(split, None)]

    def preference(half, group):
        means = logprob[half][:, groups[group]][..., eligible].mean(axis=1).T / count[half, eligible][:, None]
        means = means - means.mean(axis=0)
        return means - means.mean(axis=1, keepdims=True)

    token_ids = np.sort(sums["token_id"].unique())[eligible]
    return token_ids, {(half, group): preference(half, group) for half in (0, 1) for group in (0, 1)}


def cross_fitted_r(sums: pd.DataFrame, num_towers: int, min_count: int) -> float:
    """Replica group 0 on one half against group 1 on the other, both ways averaged (Pearson over types x towers)."""
    _, preference = group_preferences(sums, num_towers, min_count)

    def pearson(x, y):
        x, y = x.ravel() - x.mean(), y.ravel() - y.mean()
        return x @ y / np.sqrt((x @ x) * (y @ y))

    return float((pearson(preference[0, 0], preference[1, 1]) + pearson(preference[0, 1], preference[1, 0])) / 2)


def cross_fitted_tower_0(sums: pd.DataFrame, num_towers: int, min_count: int):
    """(token ids, tower 0's mean cross-fitted preference in nats against the other towers): the four group-and-half
    preferences averaged."""
    token_ids, preference = group_preferences(sums, num_towers, min_count)
    return token_ids, np.mean(list(preference.values()), axis=0)[:, 0] * num_towers / (num_towers - 1)


def labels_at(tags: pd.DataFrame, token_ids, threshold: float):
    """(is_function, is_content) [types] with each type's majority tag where at least `threshold` of its occurrences
    agree (at 0.8, the rows the tagging marked `tagged`)."""
    table = tags.set_index("token_id")
    kept = table["tagged"] if threshold == PRIMARY_THRESHOLD else table["agreement"] >= threshold
    tag = table["tag"].where(kept).reindex(token_ids).to_numpy()
    return np.isin(tag, FUNCTION_TAGS), np.isin(tag, CONTENT_TAGS)


def contrast(values, is_function, is_content) -> dict | None:
    """d (function-word types' mean minus content-word types'), z = (|d| - mean) / sd of |d| over PERMUTATIONS
    shuffles of the labels (numpy's default_rng(0), as the study draws them), and the share of the variance the label
    explains; None where either group is empty."""
    if not (is_function.any() and is_content.any()):
        return None
    values, labels = values[is_function | is_content], is_function[is_function | is_content]

    def difference(labels):
        return values[labels].mean() - values[~labels].mean()

    rng = np.random.default_rng(0)
    null = np.abs([difference(rng.permutation(labels)) for _ in range(PERMUTATIONS)])
    d = difference(labels)
    share = labels.mean() * (1 - labels.mean()) * d**2 / values.var()
    return {"d": float(d), "z": float((abs(d) - null.mean()) / null.std(ddof=1)), "variance_share": float(share)}


def without_frequency_trend(values, sums: pd.DataFrame, token_ids):
    """The preference less its least-squares line on each type's log count (both halves)."""
    log_count = np.log(sums.groupby("token_id")["count"].sum().reindex(token_ids).to_numpy(np.float64))
    design = np.column_stack([np.ones_like(log_count), log_count])
    return values - design @ np.linalg.lstsq(design, values, rcond=None)[0]


def noise_only_sums(sums: pd.DataFrame, tower: int, replicas: int) -> pd.DataFrame:
    """One tower's replicas as two pseudo-towers: its replicas 0, 2, ... against 1, 3, ... (each cross-fitting group
    keeps replicas of the run's same group)."""
    order = [*range(0, replicas, 2), *range(1, replicas, 2)]
    renamed = {f"logprob_sum_probe{tower * replicas + old}": f"logprob_sum_probe{new}" for new, old in enumerate(order)}
    return sums[["half", "token_id", "count", *renamed]].rename(columns=renamed)


def part_of_speech_figures(sums: pd.DataFrame, num_towers: int, min_count: int, tags: pd.DataFrame) -> dict:
    """Endpoint 3 and its readings for one run: z, d and the variance share at 0.8, z with the log-frequency trend
    removed, and at every threshold the probe-noise-only z (the mean over towers) and the z over it."""
    token_ids, tower_0 = cross_fitted_tower_0(sums, num_towers, min_count)
    primary = contrast(tower_0, *labels_at(tags, token_ids, PRIMARY_THRESHOLD))
    if primary is None:
        return {}
    adjusted = contrast(without_frequency_trend(tower_0, sums, token_ids), *labels_at(tags, token_ids, PRIMARY_THRESHOLD))
    figures = {"part_of_speech_z": primary["z"], "d": primary["d"], "variance_share": primary["variance_share"],
               "part_of_speech_z_frequency_adjusted": adjusted["z"]}
    replicas = sum(c.startswith("logprob_sum_probe") for c in sums) // num_towers
    if replicas % 4:
        return figures
    for threshold in THRESHOLDS:
        z = contrast(tower_0, *labels_at(tags, token_ids, threshold))
        noise = []
        for tower in range(num_towers):
            pseudo = noise_only_sums(sums, tower, replicas)
            pseudo_ids, pseudo_0 = cross_fitted_tower_0(pseudo, 2, min_count)
            noise.append(contrast(pseudo_0, *labels_at(tags, pseudo_ids, threshold)))
        if z is None or any(value is None for value in noise):
            continue
        noise_z = float(np.mean([value["z"] for value in noise]))
        suffix = "" if threshold == PRIMARY_THRESHOLD else f"_at_{threshold}"
        figures |= {f"noise_only_z{suffix}": noise_z, f"z_over_noise{suffix}": z["z"] - noise_z}
    return figures


def pooled_preference(sums: pd.DataFrame, num_towers: int, min_count: int):
    """(token ids, tower 0's preference [types]) over both halves, as the cross-seed correlation reads it: each
    tower's replica-mean log-prob less the other towers', per occurrence, less its occurrence-weighted mean."""
    logprob, count = half_means(sums, num_towers)
    tower_sums, count = logprob.sum(axis=0).mean(axis=1), count.sum(axis=0)  # [towers, types], [types]
    contrast_sums = tower_sums - (tower_sums.sum(axis=0, keepdims=True) - tower_sums) / (num_towers - 1)
    offset = contrast_sums.sum(axis=1, keepdims=True) / count.sum()
    eligible = count >= min_count
    token_ids = np.sort(sums["token_id"].unique())[eligible]
    return token_ids, (contrast_sums[:, eligible] / count[eligible] - offset)[0]


def ablation_agreement(sums: pd.DataFrame, num_towers: int, min_count: int) -> float | None:
    """Endpoint 4: Pearson's r over the types seen min_count times in the whole text of the probe preference (tower
    0's replica-mean log-prob less tower 1's, per occurrence) and the mean-ablation preference (the joint loss's rise
    when tower 0 is mean-ablated less when tower 1 is, per occurrence); None without the ablation sums or for other
    than two towers."""
    ablation = [f"ablation_increase_sum_tower{tower}" for tower in range(2)]
    if num_towers != 2 or any(column not in sums for column in ablation):
        return None
    totals = sums.groupby("token_id").sum(numeric_only=True).astype(float)
    totals = totals[totals["count"] >= min_count]
    replicas = sum(column.startswith("logprob_sum_probe") for column in totals) // num_towers
    tower_logprob = [totals[[f"logprob_sum_probe{tower * replicas + k}" for k in range(replicas)]].mean(axis=1)
                     for tower in range(2)]
    probe = (tower_logprob[0] - tower_logprob[1]) / totals["count"]
    measured = (totals[ablation[0]] - totals[ablation[1]]) / totals["count"]
    return float(np.corrcoef(probe, measured)[0, 1])


def matched_r(first, second) -> float:
    """Two runs' matched correlation over their shared types (two towers: |r| of tower 0's preferences)."""
    shared, a, b = np.intersect1d(first[0], second[0], return_indices=True)
    return float(abs(np.corrcoef(first[1][a], second[1][b])[0, 1]))


def oriented_d(runs: list[dict]) -> list[float]:
    """Each run's d with its towers oriented to the first run's: flipped where its cross-fitted preference
    correlates negatively with the first's over their shared types."""
    reference_ids, reference = runs[0]["cross_fitted"]
    oriented = []
    for run in runs:
        token_ids, values = run["cross_fitted"]
        _, a, b = np.intersect1d(reference_ids, token_ids, return_indices=True)
        oriented.append(float(np.sign(np.corrcoef(reference[a], values[b])[0, 1]) * run["d"]))
    return oriented


def t_interval(values) -> dict:
    values = np.asarray(values, float)
    mean = float(values.mean())
    if values.size < 2:
        return {"value": mean, "ci": None, "n": int(values.size)}
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, values.size - 1) * values.std(ddof=1) / np.sqrt(values.size)
    return {"value": mean, "ci": [mean - half, mean + half], "n": int(values.size)}


def effects(frame: pd.DataFrame) -> dict:
    """The linear model value ~ c + e + c x e (c, e coded +-1) and each effect's estimate, t interval, p."""
    c, e = frame["c"].to_numpy(float), frame["e"].to_numpy(float)
    design = np.column_stack([np.ones_like(c), c, e, c * e])
    coefficients, *_ = np.linalg.lstsq(design, frame["value"].to_numpy(float), rcond=None)
    residual = frame["value"].to_numpy(float) - design @ coefficients
    df = len(c) - 4
    result = {}
    for name, contrast in EFFECTS.items():
        contrast = np.asarray(contrast, float)
        estimate = float(contrast @ coefficients)
        if df < 1:
            result[name] = {"value": estimate, "ci": None, "p": None}
            continue
        se = np.sqrt(residual @ residual / df * contrast @ np.linalg.inv(design.T @ design) @ contrast)
        half = stats.t.ppf(0.5 + CONFIDENCE / 2, df) * se
        result[name] = {"value": estimate, "ci": [estimate - half, estimate + half],
                        "p": float(2 * stats.t.sf(abs(estimate) / se, df))}
    return result


def endpoint_figures(frame: pd.DataFrame, column: str) -> dict:
    """One endpoint at one text and point, over the runs that have it: each cell's mean over seeds with its t
    interval, and the effects."""
    frame = frame[frame[column].notna()].assign(value=frame[column])
    cells = {CELLS[cell]: t_interval(rows["value"]) for cell, rows in frame.groupby(["c", "e"])}
    return {"cells": cells, "effects": effects(frame) if len(cells) == 4 else None}


def sign_flip_p(differences) -> float:
    """The exact two-sided p of a paired mean difference over every sign flip of the differences."""
    differences = np.asarray(differences, float)
    flips = np.array(np.meshgrid(*[[1, -1]] * differences.size)).reshape(differences.size, -1).T
    means = np.abs((flips * differences).mean(axis=1))
    return float(np.mean(means >= abs(differences.mean()) - 1e-12 * max(1.0, abs(differences.mean()))))


ENDPOINT_LABELS = {"value": "cross-fitted r", "part_of_speech_z": "part-of-speech z",
                   "part_of_speech_z_frequency_adjusted": "part-of-speech z, log-frequency trend removed",
                   "noise_only_z": "part-of-speech z of probe noise alone", "z_over_noise": "part-of-speech z over noise",
                   "variance_share": "variance share of the function/content label",
                   "ablation_agreement": "ablation agreement"}
RUN_ENDPOINTS = ("value", "part_of_speech_z", "part_of_speech_z_frequency_adjusted", "noise_only_z", "z_over_noise",
                 "variance_share", *(f"z_over_noise_at_{t}" for t in THRESHOLDS if t != PRIMARY_THRESHOLD),
                 "ablation_agreement")


def run_rows(report_dir: Path, index: pd.DataFrame) -> list[dict]:
    """Per row of the index (run, point, text): its figures, and what the cross-seed and sign readings need."""
    rows = []
    for row in index.itertuples():
        sums = read_kept_table(report_dir / row.path, SUMS_COLUMNS)
        figures = {"run": row.run, "seed": int(row.seed), "text": row.text, "step": int(row.step),
                   "cross_fitted_r": row.cross_fitted_r, "value": cross_fitted_r(sums, row.num_towers, row.min_count),
                   "pooled": pooled_preference(sums, row.num_towers, row.min_count),
                   "cross_fitted": cross_fitted_tower_0(sums, row.num_towers, row.min_count),
                   "ablation_agreement": ablation_agreement(sums, row.num_towers, row.min_count)}
        if isinstance(getattr(row, "type_tags_path", None), str):
            tags = read_kept_table(report_dir / row.type_tags_path, TAGS_COLUMNS)
            figures |= part_of_speech_figures(sums, row.num_towers, row.min_count, tags)
        rows.append(figures | group_of(row))
    return rows


def group_of(row) -> dict:
    """The run's 2x2 codes (c, e) and, in the joint-gradient experiment, its arm."""
    group = {"c": 1 if row.cooperative else -1, "e": -1 if row.separate_embeddings else 1}
    if getattr(row, "tower_heads", False):
        group["arm"] = "joint" if row.joint_gradient else "stopped"
    return group


def cross_seed(runs: list[dict]) -> dict:
    """The mean matched r over seed pairs and each pair's (by seeds)."""
    pairs = {f"{a['seed']}-{b['seed']}": matched_r(a["pooled"], b["pooled"])
             for a, b in itertools.combinations(sorted(runs, key=lambda run: run["seed"]), 2)}
    return {"r": float(np.mean(list(pairs.values()))) if pairs else None, "pair_r": pairs}


def factorial_point(frame: pd.DataFrame, runs: list[dict]) -> dict:
    """The 2x2 at one text and point: every endpoint's cells and effects, the pooled cooperative means, the cross-seed
    r and the oriented signs per cell."""
    point = {name: endpoint_figures(frame, name) for name in RUN_ENDPOINTS if name in frame and frame[name].notna().any()}
    cooperative = frame[frame["c"] == 1]
    point["cooperative_means"] = {name: t_interval(cooperative[name].dropna()) for name in RUN_ENDPOINTS
                                  if name != "value" and name in cooperative and cooperative[name].notna().any()}
    point["cross_seed"], point["signs"] = {}, {}
    for cell, name in CELLS.items():
        members = sorted((run for run in runs if (run["c"], run["e"]) == cell), key=lambda run: run["seed"])
        point["cross_seed"][name] = cross_seed(members)
        if members and all("d" in run for run in members):
            point["signs"][name] = dict(zip((run["seed"] for run in members), oriented_d(members)))
    return point


def arms_point(frame: pd.DataFrame, runs: list[dict]) -> dict:
    """The joint-gradient experiment at one text and point: every endpoint's arms and paired difference (joint minus
    stopped, by seed: mean, t interval, exact sign-flip p), and each arm's cross-seed r."""
    point = {}
    for name in RUN_ENDPOINTS:
        if name not in frame or frame[name].isna().all():
            continue
        arms = {arm: rows.set_index("seed")[name].dropna() for arm, rows in frame.groupby("arm")}
        paired = pd.concat(arms, axis=1).dropna() if len(arms) == 2 else None
        difference = None
        if paired is not None and len(paired) >= 2:
            values = (paired["joint"] - paired["stopped"]).to_numpy()
            difference = t_interval(values) | {"p": sign_flip_p(values)}
        point[name] = {"arms": {arm: t_interval(values) for arm, values in arms.items()}, "difference": difference}
    point["cross_seed"] = {arm: cross_seed([run for run in runs if run["arm"] == arm]) for arm in ("joint", "stopped")}
    return point


def recompute(report_dir: Path) -> dict:
    """Every figure the module docstring lists, per run and per text and point."""
    index = read_kept_table(report_dir / "run_index.parquet", INDEX_COLUMNS)
    missing = [path for path in index["path"] if not (report_dir / path).is_file()]
    if missing:  # a folder whose run tables are archived out of the working tree (its full_tables.json lists them)
        raise ArchivedTablesError(
            f"{len(missing)} of the tables {report_dir / 'run_index.parquet'} names are not in the working tree "
            f"(the first: {report_dir / missing[0]}); where {report_dir / 'full_tables.json'} lists them as archived "
            f"run tables, `python scripts/convert_kept_runs.py {report_dir} --restore_runs` writes them back")
    rows = run_rows(report_dir, index)
    frame = pd.DataFrame([{key: value for key, value in row.items() if key not in ("pooled", "cross_fitted")}
                          for row in rows])
    result = {"runs": frame.drop(columns=["c", "e"]).to_dict("records"), "points": []}
    for (text, step), point_frame in frame.groupby(["text", "step"], sort=False):
        runs = [row for row in rows if row["text"] == text and row["step"] == step]
        point = {"text": text, "step": int(step)}
        if "arm" in point_frame and point_frame["arm"].notna().all():
            point["arms"] = arms_point(point_frame, runs)
        else:
            point |= factorial_point(point_frame, runs)
        result["points"].append(point)
    return json.loads(json.dumps(result, default=float))  # numpy numbers as plain ones


def with_ci(figure: dict) -> str:
    if figure["ci"] is None:
        return f"{figure['value']:.2f}"
    return f"{figure['value']:.2f} [{figure['ci'][0]:.2f}, {figure['ci'][1]:.2f}]"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("report_dir", type=Path, help="a study's report folder (holding run_index.parquet)")
    parser.add_argument("--json", action="store_true", help="print every figure as JSON, unrounded")
    args = parser.parse_args(argv)
    try:
        result = recompute(args.report_dir)
    except ArchivedTablesError as error:
        raise SystemExit(f"error: {error}.") from None
    except KeptTableError as error:
        raise SystemExit(f"error: {error}; copy the study's report folder again (or rerun the study).") from None
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    print("cross-fitted r per run (recomputed; as its scoring wrote it)")
    for run in result["runs"]:
        print(f"  {run['run']:<32} {run['text']:<20} step {run['step']:>6}  {run['value']:.4f}  ({run['cross_fitted_r']:.4f})")
    for point in result["points"]:
        print(f"{point['text']}, step {point['step']}")
        if "arms" in point:
            for name, figures in point["arms"].items():
                if name == "cross_seed":
                    print("  cross-seed r: " + ", ".join(f"{arm} {f['r']:.3f}" for arm, f in figures.items() if f["r"] is not None))
                    continue
                difference = figures["difference"]
                print(f"  {ENDPOINT_LABELS.get(name, name)}: " + ", ".join(f"{arm} {with_ci(f)}" for arm, f in figures["arms"].items())
                      + ("" if difference is None else f"; joint minus stopped {with_ci(difference)}, sign-flip p {difference['p']:.3g}"))
            continue
        for name in RUN_ENDPOINTS:
            if name not in point:
                continue
            print(f"  {ENDPOINT_LABELS.get(name, name)}: cells (mean over seeds, 95% t interval)")
            for cell, figure in point[name]["cells"].items():
                print(f"    {cell:<34} {with_ci(figure)}  ({figure['n']} seeds)")
            for effect, figure in (point[name]["effects"] or {}).items():
                p = "" if figure["p"] is None else f"  p {figure['p']:.3g}"
                print(f"    effect of {effect:<22} {with_ci(figure)}{p}")
            if name in point["cooperative_means"]:
                print(f"    both cooperative cells pooled       {with_ci(point['cooperative_means'][name])}")
        print("  cross-seed r per cell: " + "; ".join(f"{cell} {f['r']:.3f}" for cell, f in point["cross_seed"].items()
                                                  if f["r"] is not None))
        for cell, signs in point["signs"].items():
            print(f"  d per seed, oriented ({cell}): " + ", ".join(f"{d:+.3f}" for d in signs.values()))
    return result


if __name__ == "__main__":
    main()
