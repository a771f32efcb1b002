"""
Mean-ablation preference: which tower the trained joint model needs for a token, with no probe at all.

Each tower's slice of the fused representation (the features `probe_features` returns, which the joint head reads)
is replaced by its mean over the scored positions of the text, and the joint model's loss at every scored position
rises by some amount: the tower's ablation increase. A type's ablation preference for tower t is tower t's mean
increase over the type's occurrences minus the mean of the other towers' (with two towers, tower 0's minus tower
1's): positive where the joint model loses more without tower t, i.e. takes more of that token from it. It is
deterministic, takes one extra pass of the towers (for the means) and one of the joint head per tower, and is
tested per type over its occurrences (PreferenceAccumulator fed the increases in place of log-probabilities; its
mean_logprob is then meaningless, its preference_nats, p_value and significant are the ablation's).
"""

import numpy as np
import torch

from .cross_fitting import pooled_pearson
from ..tower_preference.measure_agreement import measure_agreement
from ..tower_preference.preference_stats import PreferenceAccumulator
from ..tower_preference.summary import summary_keys


# what preference.json keeps of the ablation preference's own summary
ABLATION_SUMMARY_FIELDS = summary_keys(
    "num_significant", "significant_share", "split_half_consistency", "num_eligible_types"
)


def check_ablation_shapes(feature_means, scored_features, scored_targets) -> None:
    """One clear error when the means, features and targets of an ablation pass are not of the same towers and
    positions (torch's own names no argument)."""
    means, features = tuple(feature_means.shape), tuple(scored_features.shape)
    if len(means) != 2 or len(features) != 3 or means != (features[0], features[2]):
        raise ValueError(
            f"MeanAblation holds means of shape {list(means)} ([towers, hidden]) but was given features of shape "
            f"{list(features)} ([towers, n, hidden]): give the features of the towers the means were taken over "
            "(`tower_feature_means` of the same model), all towers at once."
        )
    if tuple(scored_targets.shape) != (features[1],):
        raise ValueError(f"MeanAblation.update: `scored_targets` has shape {list(scored_targets.shape)}, the features "
                         f"hold {features[1]} positions: give one target per scored position, [n].")


class MeanAblation:
    """
    The ablation increases of every scored position, fed into a PreferenceAccumulator.

    Args:
        feature_means: [towers, hidden], each tower's mean feature over the scored positions (`tower_feature_means`).
        vocab_size: token ids are below it.
    """

    def __init__(self, feature_means: torch.Tensor, vocab_size: int):
        self.feature_means = feature_means
        self.accumulator = PreferenceAccumulator(num_towers=feature_means.shape[0], vocab_size=vocab_size)
        self.increase_sums = np.zeros(feature_means.shape[0])  # [towers] float64, over all scored positions

    def update(self, model, scored_features, scored_targets) -> np.ndarray:
        """One scoring pass of `model`: features [towers, n, hidden] of its scored positions and their targets [n]
        (`model.scored_features`); returns the increases [towers, n] (`model.ablation_increases`)."""
        check_ablation_shapes(self.feature_means, scored_features, scored_targets)
        increases = model.ablation_increases(scored_features, scored_targets, self.feature_means)
        increases = increases.double().cpu().numpy()  # [towers, n]
        self.increase_sums += increases.sum(axis=1)
        # The accumulator takes log-probabilities (<= 0) and tests differences between towers at each position, so
        # the increases enter less their largest at the position: the differences, hence the test, are the increases'.
        self.accumulator.update(scored_targets.cpu().numpy(), increases - increases.max(axis=0))
        return increases

    def mean_increase_nats(self) -> list[float]:
        """Each tower's ablation increase averaged over every scored position: how much the joint model needs it."""
        return (self.increase_sums / self.accumulator.num_predictions).tolist()


@torch.inference_mode()
def tower_feature_means(model, passes) -> torch.Tensor:
    """
    Each tower's mean feature [towers, hidden] (float32) over the scored positions of `passes`, an iterable of
    (inputs, labels, attention_mask) scoring passes (engine.py's).
    """
    total, count = None, 0
    for inputs, labels, attention_mask in passes:
        features, _ = model.scored_features(model.probe_features(inputs, attention_mask), labels)  # [towers, n, hidden]
        sums = features.double().sum(dim=1)
        total = sums if total is None else total + sums
        count += features.shape[1]
    return (total / count).float()


def ablation_summary(ablation, probe_result, mean_increase_nats: list[float]) -> dict:
    """
    What preference.json keeps of the ablation preference (a PreferenceResult of the same positions as the probes'
    `probe_result`): each tower's mean increase, the occurrence-level test's counts, and the correlation of the
    ablation preference with the probe preference over the eligible types (Pearson's, over towers too).
    """
    eligible = probe_result.eligible
    # each tower's preference centered over the types, then all towers together (two towers: Pearson's r of tower 0's)
    probe, ablated = (values[:, eligible] - values[:, eligible].mean(axis=1, keepdims=True)
                      for values in (probe_result.preference_nats, ablation.preference_nats))
    correlation = pooled_pearson(probe, ablated) if eligible.sum() >= 3 else None
    return {
        "mean_increase_nats": mean_increase_nats,
        **{key: ablation.summary[key] for key in ABLATION_SUMMARY_FIELDS},
        "correlation_with_probe_preference": correlation,
        "correlation_with_probe_preference_ci": measure_agreement(
            probe_result.preference_nats, ablation.preference_nats, eligible)["ci"],
    }
