"""
Recompute a tower preference study's headline figures from its kept Parquet tables alone, with numpy, pandas and
scipy (no import of the twotower package): each run's cross-fitted r at every kept point and text, the 2x2 cells'
means over seeds with their 95% t intervals, and the effects of cooperation, embedding sharing and their interaction
(effect-coded linear model, t intervals, two-sided p).

    python scripts/recompute_study.py docs/study/causes          # a table to read
    python scripts/recompute_study.py docs/study/causes --json   # every figure, unrounded

Reads REPORT_DIR/run_index.parquet (one row per run, point and text) and each row's type_sums.parquet (per half and
token type: count, logprob_sum_probe{k} with probe k = tower * replicas + replica).
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


def half_means(sums: pd.DataFrame, num_towers: int):
    """(mean log-prob [halves, towers, replicas, types], eligible counts) over the types seen in both halves."""
    probes = sorted((c for c in sums if c.startswith("logprob_sum_probe")), key=lambda c: int(c[17:]))
    wide = sums.pivot(index="token_id", columns="half", values=["count", *probes]).fillna(0)
    count = np.stack([wide[("count", half)].to_numpy() for half in (0, 1)])  # [halves, types]
    logprob = np.stack([[wide[(probe, half)].to_numpy() for probe in probes] for half in (0, 1)])
    replicas = len(probes) // num_towers
    return logprob.reshape(2, num_towers, replicas, -1), count


def cross_fitted_r(sums: pd.DataFrame, num_towers: int, min_count: int) -> float:
    """Replicas 0..R/2-1 on one half against the rest on the other, both ways averaged (Pearson over types x
    towers of the per-type mean log-prob, centered over types, then over towers)."""
    logprob, count = half_means(sums, num_towers)
    eligible = (count >= min_count).all(axis=0)
    split = logprob.shape[2] // 2
    groups = [slice(0, split), slice(split, None)]

    def preference(half, group):
        means = logprob[half][:, groups[group]][..., eligible].mean(axis=1).T / count[half, eligible][:, None]
        means = means - means.mean(axis=0)
        return means - means.mean(axis=1, keepdims=True)

    def pearson(x, y):
        x, y = x.ravel() - x.mean(), y.ravel() - y.mean()
        return x @ y / np.sqrt((x @ x) * (y @ y))

    return float((pearson(preference(0, 0), preference(1, 1)) + pearson(preference(0, 1), preference(1, 0))) / 2)


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


def recompute(report_dir: Path) -> dict:
    index = pd.read_parquet(report_dir / "run_index.parquet")
    index["value"] = [cross_fitted_r(pd.read_parquet(report_dir / row.path), row.num_towers, row.min_count)
                      for row in index.itertuples()]
    index["c"] = np.where(index["cooperative"], 1, -1)
    index["e"] = np.where(index["separate_embeddings"], -1, 1)
    result = {"runs": index[["run", "text", "step", "value", "cross_fitted_r"]].to_dict("records"), "points": []}
    for (text, step), frame in index.groupby(["text", "step"], sort=False):
        cells = {CELLS[cell]: t_interval(rows["value"]) for cell, rows in frame.groupby(["c", "e"])}
        point = {"text": text, "step": int(step), "cells": cells, "effects": None}
        if len(cells) == 4:
            point["effects"] = effects(frame)
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
    result = recompute(args.report_dir)
    if args.json:
        print(json.dumps(result, indent=1))
        return result
    print("cross-fitted r per run (recomputed; as its scoring wrote it)")
    for run in result["runs"]:
        print(f"  {run['run']:<32} {run['text']:<20} step {run['step']:>6}  {run['value']:.4f}  ({run['cross_fitted_r']:.4f})")
    for point in result["points"]:
        print(f"{point['text']}, step {point['step']}: cells (mean over seeds, 95% t interval)")
        for cell, figure in point["cells"].items():
            print(f"  {cell:<34} {with_ci(figure)}  ({figure['n']} seeds)")
        for name, figure in (point["effects"] or {}).items():
            p = "" if figure["p"] is None else f"  p {figure['p']:.3g}"
            print(f"  effect of {name:<24} {with_ci(figure)}{p}")
    return result


if __name__ == "__main__":
    main()
