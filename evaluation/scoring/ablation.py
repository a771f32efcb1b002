"""
The mean-ablation preference in the scoring command: its measure (tower_preference/mean_ablation.py, where
`MeanAblation` and `tower_feature_means` live beside the measure's other declarations), and the summary that
preference.json keeps of it.
"""

from ..tower_preference.mean_ablation import MeanAblation, check_ablation_shapes, tower_feature_means
from ..tower_preference.preference_measure import intervention_summary


def ablation_summary(ablation, probe_result, mean_increase_nats: list[float], others=None) -> dict:
    """
    What preference.json keeps of a probe-free measure's preference (`ablation`, a PreferenceResult of the same
    positions as the probes' `probe_result`): each tower's mean increase, the occurrence-level test's counts, and the
    correlation of its preference with the probe preference over the eligible types (Pearson's, over towers too),
    and with each of `others` ({name: PreferenceResult}).
    """
    return intervention_summary(
        ablation.summary, ablation.preference_nats, probe_result.preference_nats, probe_result.eligible,
        mean_increase_nats, {name: other.preference_nats for name, other in (others or {}).items()},
    )


__all__ = ["MeanAblation", "ablation_summary", "check_ablation_shapes", "tower_feature_means"]
