"""
Recompute a tower preference study's headline figures from its kept Parquet tables alone, with numpy, pandas and
scipy (no import of the twotower package): each run's cross-fitted r at every kept point and text, the 2x2 cells'
means over seeds with their 95% t intervals, and the effects of cooperation, embedding sharing and their interaction
(effect-coded linear model, t intervals, two-sided p); the same for each run's part-of-speech z where the study kept
the scored texts' tags.

    python scripts/recompute_study.py docs/study/causes          # a table to read
    python scripts/recompute_study.py docs/study/causes --json   # every figure, unrounded

Reads REPORT_DIR/run_index.parquet (one row per run, point and text) and each row's type_sums.parquet (per half and
token type: count, logprob_sum_probe{k} with probe k = tower * replicas + replica) and, where it names them, the
text's tags (type_tags/*.parquet: token_id, tag, tagged). Each table is checked as it is read: one that does not
read, lacks a column the figures need or holds a NaN or infinite number is named, and nothing is recomputed.
"""

import argparse
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
INDEX_COLUMNS = ("run", "text", "step", "num_towers", "min_count", "cooperative", "separate_embeddings", "path")
SUMS_COLUMNS = ("half", "token_id", "count", "logprob_sum_probe0")
TAGS_COLUMNS = ("token_id", "tag", "tagged")


class KeptTableError(ValueError):
    """A kept table the figures cannot be recomputed from."""


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


def part_of_speech_z(sums: pd.DataFrame, num_towers: int, min_count: int, tags: pd.DataFrame) -> float | None:
    """Endpoint 3: d = tower 0's mean cross-fitted preference (the four group-and-half preferences averaged, in
    nats against the other towers) over function-word types minus over content-word types, and z = (|d| - mean) /
    sd of |d| over PERMUTATIONS shuffles of the two labels (numpy's default_rng(0), as the study draws them); None
    where the eligible types lack function words or content words."""
    token_ids, preference = group_preferences(sums, num_towers, min_count)
    tower_0 = np.mean(list(preference.values()), axis=0)[:, 0] * num_towers / (num_towers - 1)
    tag = tags.set_index("token_id")["tag"].where(tags.set_index("token_id")["tagged"]).reindex(token_ids).to_numpy()
    is_function, is_content = np.isin(tag, FUNCTION_TAGS), np.isin(tag, CONTENT_TAGS)
    if not (is_function.any() and is_content.any()):
        return None
    values, labels = tower_0[is_function | is_content], is_function[is_function | is_content]

    def difference(labels):
        return values[labels].mean() - values[~labels].mean()

    rng = np.random.default_rng(0)
    null = np.abs([difference(rng.permutation(labels)) for _ in range(PERMUTATIONS)])
    return float((abs(difference(labels)) - null.mean()) / null.std(ddof=1))


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


def recompute(report_dir: Path) -> dict:
    """Endpoint 1 (the cross-fitted r) per run and its 2x2 at every text and point; endpoint 3 (the part-of-speech
    z) where the index names the text's kept tags (`type_tags_path`)."""
    index = read_kept_table(report_dir / "run_index.parquet", INDEX_COLUMNS)
    sums = [read_kept_table(report_dir / row.path, SUMS_COLUMNS) for row in index.itertuples()]
    index["value"] = [cross_fitted_r(table, row.num_towers, row.min_count)
                      for table, row in zip(sums, index.itertuples())]
    tagged = "type_tags_path" in index and index["type_tags_path"].notna().all()
    if tagged:
        index["part_of_speech_z"] = [
            part_of_speech_z(table, row.num_towers, row.min_count,
                             read_kept_table(report_dir / row.type_tags_path, TAGS_COLUMNS))
            for table, row in zip(sums, index.itertuples())]
    index["c"] = np.where(index["cooperative"], 1, -1)
    index["e"] = np.where(index["separate_embeddings"], -1, 1)
    columns = ["run", "text", "step", "value", "cross_fitted_r", *(["part_of_speech_z"] if tagged else [])]
    result = {"runs": index[columns].to_dict("records"), "points": []}
    for (text, step), frame in index.groupby(["text", "step"], sort=False):
        point = {"text": text, "step": int(step), **endpoint_figures(frame, "value")}
        if tagged:
            point["part_of_speech_z"] = endpoint_figures(frame, "part_of_speech_z")
        result["points"].append(point)
    return result


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
    except KeptTableError as error:
        raise SystemExit(f"error: {error}; copy the study's report folder again (or rerun the study).") from None
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    print("cross-fitted r per run (recomputed; as its scoring wrote it)")
    for run in result["runs"]:
        print(f"  {run['run']:<32} {run['text']:<20} step {run['step']:>6}  {run['value']:.4f}  ({run['cross_fitted_r']:.4f})")
    for point in result["points"]:
        for name, figures in (("cross-fitted r", point), ("part-of-speech z", point.get("part_of_speech_z"))):
            if figures is None:
                continue
            print(f"{point['text']}, step {point['step']}, {name}: cells (mean over seeds, 95% t interval)")
            for cell, figure in figures["cells"].items():
                print(f"  {cell:<34} {with_ci(figure)}  ({figure['n']} seeds)")
            for effect, figure in (figures["effects"] or {}).items():
                p = "" if figure["p"] is None else f"  p {figure['p']:.3g}"
                print(f"  effect of {effect:<24} {with_ci(figure)}{p}")
    return result


if __name__ == "__main__":
    main()
