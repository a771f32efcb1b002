"""How far the two measures of preference agree: what probes decode from each tower, and what the joint model relies on.

The probe preference says which tower's features let a newly trained reader (a probe) predict a token type better:
*decodable from the tower*. The mean-ablation preference says which tower the trained joint model loses more without:
*relied on by the joint model*. Both are per type; their agreement is the correlation over the eligible types, with a
percentile bootstrap interval over types (the types resampled, the model and the probes fixed). The report leads
with it and chooses its words from it; the token view's hover card says it when the two point to different towers.
"""

import numpy as np


DECODABLE = "decodable from the tower"  # the probe preference
RELIED_ON = "relied on by the joint model"  # the mean-ablation preference
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_BATCH = 200  # resamples held in memory at once
CONFIDENCE = 0.95


def pooled_correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r of [..., towers, types] arrays over towers and types together, each tower centered over its types
    first (two towers: the r of tower 0's preferences); NaN where one side is constant."""
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    x, y = x.reshape(*x.shape[:-2], -1), y.reshape(*y.shape[:-2], -1)
    x, y = x - x.mean(axis=-1, keepdims=True), y - y.mean(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (x * y).sum(axis=-1) / np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))


def measure_agreement(probe_preference, ablation_preference, eligible) -> dict:
    """{"r", "ci", "num_types"}: the correlation of the two preferences ([towers, types] each) over the eligible
    types and its 95% bootstrap interval over types; r and ci None with fewer than 3 eligible types."""
    eligible = np.asarray(eligible, dtype=bool)
    probe = np.asarray(probe_preference, dtype=float)[:, eligible]
    ablation = np.asarray(ablation_preference, dtype=float)[:, eligible]
    num_types = int(eligible.sum())
    r = pooled_correlation(probe, ablation) if num_types >= 3 else np.nan
    if not np.isfinite(r):
        return {"r": None, "ci": [None, None], "num_types": num_types}
    rng = np.random.default_rng(BOOTSTRAP_SEED)
    values = []
    for start in range(0, BOOTSTRAP_RESAMPLES, BOOTSTRAP_BATCH):
        draws = rng.integers(num_types, size=(min(BOOTSTRAP_BATCH, BOOTSTRAP_RESAMPLES - start), num_types))
        values.append(pooled_correlation(np.moveaxis(probe[:, draws], 1, 0), np.moveaxis(ablation[:, draws], 1, 0)))
    tail = 100 * (1 - CONFIDENCE) / 2
    low, high = np.nanpercentile(np.concatenate(values), [tail, 100 - tail])
    return {"r": float(r), "ci": [float(low), float(high)], "num_types": num_types}


def agreement_verdict(agreement: dict | None) -> str:
    """What the agreement says, in one sentence for the report: "agree", "partly agree" or "do not agree"."""
    if agreement is None or agreement["r"] is None:
        return "unknown"
    low, high = agreement["ci"]
    if low > 0.5:
        return "agree"
    if low > 0.0:
        return "partly agree"
    return "disagree" if high < 0.0 else "do not agree"
