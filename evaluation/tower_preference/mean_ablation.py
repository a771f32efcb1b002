"""
Mean ablation: which tower the trained joint model needs for a token, with no probe at all.

Each tower's slice of the fused representation (the features `probe_features` returns, which the joint head reads)
is replaced by its mean over the scored positions of the text, and the joint model's loss at every scored position
rises by some amount: the tower's ablation increase. A type's ablation preference for tower t is tower t's mean
increase over the type's occurrences minus the mean of the other towers' (with two towers, tower 0's minus tower
1's): positive where the joint model loses more without tower t, i.e. takes more of that token from it. It is
deterministic, takes one extra pass of the towers (for the means) and one of the joint head per tower, and is
tested per type over its occurrences (PreferenceAccumulator fed the increases in place of log-probabilities; its
mean_logprob is then meaningless, its preference_nats, p_value and significant are the ablation's).
"""

import torch


try:  # a module of the package; the Space's app.py imports this file from its own folder
    from .preference_measure import InterventionScores, TowerIntervention
except ImportError:
    from preference_measure import InterventionScores, TowerIntervention


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


class MeanAblation(InterventionScores):
    """
    The ablation increases of every scored position, fed into a PreferenceAccumulator.

    Args:
        feature_means: [towers, hidden], each tower's mean feature over the scored positions (`tower_feature_means`).
        vocab_size: token ids are below it.
        model: the scored model, for the scoring engine's `update_pass`.
    """

    def __init__(self, feature_means: torch.Tensor, vocab_size: int, model=None):
        super().__init__(MeanAblationMeasure.name, feature_means.shape[0], vocab_size, model)
        self.feature_means = feature_means

    def replacements(self, scored_pass, scored_features) -> torch.Tensor:
        return self.feature_means

    def update(self, model, scored_features, scored_targets, replacements=None):
        """One scoring pass of `model`: features [towers, n, hidden] of its scored positions and their targets [n]
        (`model.scored_features`); returns the increases [towers, n] (`model.ablation_increases`)."""
        check_ablation_shapes(self.feature_means, scored_features, scored_targets)
        return super().update(model, scored_features, scored_targets, self.feature_means)


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


class MeanAblationMeasure(TowerIntervention):
    """Mean ablation: a tower's state replaced by its mean over the scored positions."""

    name = "ablation"
    label = "mean ablation"
    method = "mean ablation, no probe"
    option = "ablation"
    replacement = "its mean over the scored positions"
    report_heading = "Ablation preference (no probe)"

    def consumer(self, model, passes):
        return MeanAblation(tower_feature_means(model, passes()), model.config.vocab_size, model)

    def space_increases(self, model, features, targets, passage_features):
        means = features.double().mean(dim=1).to(features.dtype)  # [towers, hidden]: over the text's scored positions
        return model.ablation_increases(features, targets, means)
