"""What a measure of tower preference declares, and the shared parts of the probe-free ones.

A measure says, per token type, which tower the type prefers. Everything downstream of scoring (the scoring command,
report.md, tokens.html, the Space, the study's readers) iterates over the registered measures (measures.py) and
reads these declarations instead of naming a measure:

- `name`: its key in the registry and in preference.json (where its summary is kept), the prefix of its columns in
  the per-token table, and its field on the token view's hover card;
- `method` and `question`: how it measures and what it measures, in words (the hover line, the report);
- `summary_key_descriptions`: every key of its summary in preference.json, each with its one description;
- `report_heading` and `report_section`: its section of report.md (a Jinja template of the section's body);
- `consumer(model, passes)`: its part of the scoring engine's pass, a PassConsumer (`begin_batch`, `update_pass`,
  evaluation/scoring/engine.py), or None where the engine's own probe sets are its part;
- `space_values(model, passages)`: what the Space computes of it for a model and a text;
- `study_reads`: the keys of its summary that the study reads (run.json and the cross-fitted verdicts).

`TowerIntervention` is the base of the probe-free measures: a tower's state in the fused representation is replaced,
and the joint model's loss at every scored position rises by that tower's *increase*; a type's preference for tower t
is tower t's mean increase over the type's occurrences minus the mean of the other towers' (PreferenceAccumulator fed
the increases less their largest at each position, in place of log-probabilities). A subclass declares only what
replaces the state (`replacements`) and its words; the consumer, the summary, the report section, the hover line and
the Space output are shared.
"""

import numpy as np
import torch


try:  # a module of the package; the Space's app.py imports this file from its own folder
    from .measure_agreement import DECODABLE, RELIED_ON, measure_agreement, pooled_pearson
    from .summary import summary_keys
except ImportError:
    from measure_agreement import DECODABLE, RELIED_ON, measure_agreement, pooled_pearson
    from summary import summary_keys


# the keys of a probe-free measure's summary, kept in preference.json under its name
INTERVENTION_SUMMARY_KEY_DESCRIPTIONS = {
    "mean_increase_nats": "per tower, the joint model's loss rise with that tower's state replaced, averaged over "
    "every scored position (nats)",
    "num_significant": "eligible types whose preference is significant over occurrences after Benjamini-Hochberg at "
    "`alpha`",
    "significant_share": "`num_significant` over the eligible types; None without eligible types",
    "split_half_consistency": "Pearson's r of the per-type preference between two halves of the predictions",
    "num_eligible_types": "token types observed at least `min_count` times",
    "correlation_with_probe_preference": "Pearson's r of its per-type preference with the probe preference over the "
    "eligible types (each tower centered over the types, then all towers together); None with fewer than 3",
    "correlation_with_probe_preference_ci": "`[low, high]`, its 95% percentile bootstrap interval over types",
    "agreement_with_measures": "per other probe-free measure scored beside it: `{\"r\", \"ci\", \"num_types\"}`, the "
    "correlation of the two per-type preferences over the eligible types and its bootstrap interval",
}
# what a probe-free measure's summary copies of its PreferenceResult's own summary
RESULT_SUMMARY_KEYS = summary_keys("num_significant", "significant_share", "split_half_consistency", "num_eligible_types")

INTERVENTION_REPORT_SECTION = """\
What is {{ measure.question }}: each tower's slice of the fused representation replaced by {{ measure.replacement }} \
({{ measure.label }}), the joint model's loss rises by {% for value in summary.mean_increase_nats %}{{ value|number }} \
nats without tower {{ loop.index0 }}{{ "" if loop.last else ", " }}{% endfor %}. A type's {{ measure.label }} \
preference for a tower is the rise without that tower minus the rise without the other\
{{ "" if num_towers == 2 else "s (their mean)" }}, over the type's occurrences: which tower the joint model takes the \
token from, with no probe involved (columns `{{ measure.name }}_*` of the per-token table).

- correlation with the probe preference over the {{ summary.num_eligible_types }} eligible types: \
{{ summary.correlation_with_probe_preference|number }}\
{% if summary.correlation_with_probe_preference_ci and summary.correlation_with_probe_preference_ci[0] is not none %} \
(95% bootstrap interval over types {{ summary.correlation_with_probe_preference_ci[0]|number }} to \
{{ summary.correlation_with_probe_preference_ci[1]|number }}){% endif +%}
{% for other, agreement in (summary.get("agreement_with_measures") or {}).items() %}
- correlation with the {{ labels[other] }} preference: {{ agreement.r|number }}\
{% if agreement.ci[0] is not none %} (95% bootstrap interval over types {{ agreement.ci[0]|number }} to \
{{ agreement.ci[1]|number }}){% endif +%}
{% endfor %}
- significant over occurrences (Benjamini-Hochberg at alpha = {{ alpha }}): {{ summary.num_significant }} types \
({{ summary.significant_share|number }} of eligible)
- split-half consistency: {{ summary.split_half_consistency|number }}
"""


class PreferenceMeasure:
    """The contract of a measure of tower preference (the module docstring lists what each declaration is for)."""

    name: str
    label: str  # the measure in a phrase: "probe replicas", "mean ablation"
    method: str  # how it measures, after its question on the hover card: "probes", "mean ablation, no probe"
    question: str  # what it measures: measure_agreement.DECODABLE or RELIED_ON
    option: str | None  # the scoring command's option that turns it on; None: always measured
    min_blocks = 1  # the fewest blocks a batch and a text must hold for it; scoring leaves it out (and says so) below
    summary_key_descriptions: dict[str, str]
    report_heading: str
    report_section: str | None  # None: the report's own sections are this measure's
    study_reads: tuple[str, ...]

    def consumer(self, model, passes):
        """Its part of the scoring engine's pass over `model`; `passes()` yields the scoring passes (inputs, labels,
        attention_mask) of the whole text, for a measure that needs a first pass of its own."""
        raise NotImplementedError

    def space_values(self, model, passages):
        """What the Space computes of it on `passages` (app.text_passages), or None where the text allows none."""
        raise NotImplementedError


class InterventionScores:
    """
    A probe-free measure's part of the scoring pass: at every scored position each tower's increase, fed into a
    PreferenceAccumulator, and left on the pass (`scored_pass.increases[name]`) for the consumers fed after it.

    Args:
        name: the measure's name.
        num_towers, vocab_size: of the scored model.
        model: the scored model; `update_pass` needs it (`update` takes it as an argument).
    """

    def __init__(self, name: str, num_towers: int, vocab_size: int, model=None):
        # imported here: the Space imports this file flat, where preference_stats' relative imports do not resolve,
        # and it never builds a consumer
        from .preference_stats import PreferenceAccumulator

        self.name, self.model = name, model
        self.accumulator = PreferenceAccumulator(num_towers=num_towers, vocab_size=vocab_size)
        self.increase_sums = np.zeros(num_towers)  # [towers] float64, over all scored positions

    def begin_batch(self, batch) -> None:
        pass

    def update_pass(self, scored_pass) -> None:
        scored_features, scored_targets = self.model.scored_features(scored_pass.features, scored_pass.labels)
        replacements = self.replacements(scored_pass, scored_features)
        scored_pass.increases[self.name] = self.update(self.model, scored_features, scored_targets, replacements)

    def replacements(self, scored_pass, scored_features) -> torch.Tensor:
        """What replaces each tower's state at the scored positions: [towers, hidden] or [towers, n, hidden]."""
        raise NotImplementedError

    def update(self, model, scored_features, scored_targets, replacements) -> np.ndarray:
        """The increases [towers, n] of features [towers, n, hidden] with each tower's replaced by `replacements`
        (`model.ablation_increases`), fed into the accumulator; returned."""
        increases = model.ablation_increases(scored_features, scored_targets, replacements)
        increases = increases.double().cpu().numpy()  # [towers, n]
        self.increase_sums += increases.sum(axis=1)
        # The accumulator takes log-probabilities (<= 0) and tests differences between towers at each position, so
        # the increases enter less their largest at the position: the differences, hence the test, are the increases'.
        self.accumulator.update(scored_targets.cpu().numpy(), increases - increases.max(axis=0))
        return increases

    def mean_increase_nats(self) -> list[float]:
        """Each tower's increase averaged over every scored position: how much the joint model needs it."""
        return (self.increase_sums / self.accumulator.num_predictions).tolist()


class TowerIntervention(PreferenceMeasure):
    """The base of the probe-free measures: a tower's state replaced, the joint model's loss rise per type."""

    question = RELIED_ON
    replacement: str  # what replaces a tower's state, in words, for report.md
    summary_key_descriptions = INTERVENTION_SUMMARY_KEY_DESCRIPTIONS
    report_section = INTERVENTION_REPORT_SECTION
    study_reads = ("correlation_with_probe_preference", "mean_increase_nats")

    def space_increases(self, model, features, targets, passage_features):
        """[towers, n] increases of the Space's text: `features` [towers, n, hidden] and `targets` [n] of its scored
        positions, `passage_features` one [towers, seq, hidden] per passage (the predicting positions); None where
        the text allows none."""
        raise NotImplementedError

    @torch.inference_mode()
    def space_values(self, model, passages):
        """[towers, n] increases at every scored position of the Space's passages (each a block of one unmasked pass)."""
        blocks = [torch.tensor([passage["token_ids"]]) for passage in passages]
        states = [model.probe_features(block) for block in blocks]  # [towers, 1, seq, hidden] each
        features, targets = zip(*(model.scored_features(state, block) for state, block in zip(states, blocks)))
        features, targets = torch.cat(features, dim=1), torch.cat(targets)  # [towers, n, hidden], [n]
        passage_features = [model.predicting_positions(state[:, 0], seq_dim=1) for state in states]
        increases = self.space_increases(model, features, targets, passage_features)
        return None if increases is None else increases.double().numpy()


def intervention_summary(summary, preference, probe_preference, eligible, mean_increase_nats, others=None) -> dict:
    """
    What preference.json keeps of a probe-free measure, from its test's `summary` and per-type `preference` [towers,
    types] (of the same types as the probes'): each tower's mean increase, the occurrence-level test's counts, its
    correlation with the probe preference ([towers, types], over the `eligible` types: Pearson's, over towers too)
    with its bootstrap interval, and its agreement with each of `others` ({name: preference [towers, types]}).
    """
    preference = np.asarray(preference, dtype=float)
    probe_preference = np.asarray(probe_preference, dtype=float)
    eligible = np.asarray(eligible, dtype=bool)
    # each tower's preference centered over the types, then all towers together (two towers: Pearson's r of tower 0's)
    probe, measured = (values[:, eligible] - values[:, eligible].mean(axis=1, keepdims=True)
                       for values in (probe_preference, preference))
    return {
        "mean_increase_nats": mean_increase_nats,
        **{key: summary[key] for key in RESULT_SUMMARY_KEYS},
        "correlation_with_probe_preference": pooled_pearson(probe, measured) if eligible.sum() >= 3 else None,
        "correlation_with_probe_preference_ci": measure_agreement(probe_preference, preference, eligible)["ci"],
        "agreement_with_measures": {name: measure_agreement(other, preference, eligible)
                                    for name, other in (others or {}).items()},
    }


def measure_card(result, token_id_index, token_id, decimals) -> dict:
    """The hover card's line of one type under a probe-free measure (`result`: its result dict): its preferred tower,
    by how much, and the occurrence-level test."""
    i = token_id_index[token_id]
    tower = result["preferred_tower"][i]
    p_value = result["p_value"][i]
    return {
        "preferred_tower": tower,
        "preference_nats": round(result["preference_nats"][tower][i], decimals),
        "eligible": result["eligible"][i],
        "significant": result["significant"][i],
        "p_value": None if p_value is None else float(f"{p_value:.3g}"),
    }


__all__ = [
    "DECODABLE",
    "INTERVENTION_SUMMARY_KEY_DESCRIPTIONS",
    "InterventionScores",
    "PreferenceMeasure",
    "RELIED_ON",
    "TowerIntervention",
    "intervention_summary",
    "measure_card",
]
