"""How far the two measures of preference agree: what probes decode from each tower, and what the joint model relies on.

The probe preference says which tower's features let a newly trained reader (a probe) predict a token type better:
*decodable from the tower*. The mean-ablation preference says which tower the trained joint model loses more without:
*relied on by the joint model*. Both are per type; their agreement is the correlation over the eligible types, with a
percentile bootstrap interval over types (the types resampled, the model and the probes fixed). The report leads
with it and chooses its words from it; the token view's hover card says it where both are beyond noise and point to
different towers.
"""

import numpy as np


DECODABLE = "decodable from the tower"  # the probe preference
RELIED_ON = "relied on by the joint model"  # the mean-ablation preference
BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0
BOOTSTRAP_BATCH = 200  # resamples held in memory at once
CONFIDENCE = 0.95
STRONG_NEGATIVE = -0.5  # an r at or below this is worded as the measures pointing opposite ways, with its interval
FEW_TYPES = 20  # below this many eligible types, a correlation over types rests on a handful of points: said so


def pooled_pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    """Pearson's r over every entry of two arrays of one shape (types x towers), or None where one is constant."""
    x, y = x.ravel() - x.mean(), y.ravel() - y.mean()
    norm = np.sqrt((x @ x) * (y @ y))
    return None if norm == 0 else float(x @ y / norm)


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


def agreement_meaning(agreement: dict | None) -> str:
    """What the agreement (measure_agreement's dict) means, in words for the report and the token view: the
    verdict, a strong negative r worded as the measures pointing opposite ways, and a caveat under FEW_TYPES types.

    Example: a strong negative r over 6 types
        >>> agreement_meaning({"r": -0.94, "ci": [-0.99, -0.62], "num_types": 6}).split(":")[0]
        'They point opposite ways'
    """
    verdict = agreement_verdict(agreement)
    if verdict == "unknown":
        return ""
    if verdict == "agree":
        meaning = "They agree: a tower whose features decode a type better is the one the joint model relies on for it."
    elif verdict == "partly agree":
        meaning = (
            "They agree in part: a tower whose features decode a type better tends to be the one the joint model "
            "relies on for it, with many exceptions."
        )
    elif verdict == "disagree" or agreement["r"] <= STRONG_NEGATIVE:
        uncertain = "" if verdict == "disagree" else ", though the interval reaches 0"
        meaning = (
            f"They point opposite ways{uncertain}: where a tower's features decode a type better, the joint model "
            "tends to rely on the other tower for it, so a card often shows each measure pointing to another tower."
        )
    else:
        meaning = (
            "They do not agree: the correlation cannot be told from 0, so which tower decodes a type better does not "
            "tell, here, which tower the joint model relies on for it; the two answer different questions."
        )
    if agreement["num_types"] < FEW_TYPES:
        meaning += (
            f" Over only {agreement['num_types']} types, though: a correlation over so few types moves a lot with "
            "each type, so read it as a hint."
        )
    return meaning
