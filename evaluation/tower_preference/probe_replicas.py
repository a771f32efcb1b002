"""
Probe replicas: which tower's features let a newly trained probe predict a token type better, the measure the metric
itself computes (tower_preference.py: the occurrence-level test with one probe per tower, the replica-level test with
several).

Its part of the scoring pass is the engine's own: every probe set's gold log-probabilities feed its accumulator
(scoring/engine.py's BlockScores). Its summary is preference.json's "summary" (summary.py declares every key), its
sections are report.md's own, its hover lines are the token view's first lines (and its colour), and its Space output
is the metric's result.
"""

try:  # a module of the package; the Space's app.py imports this file from its own folder
    from .preference_measure import DECODABLE, PreferenceMeasure
    from .summary import SUMMARY_KEY_DESCRIPTIONS
except ImportError:
    from preference_measure import DECODABLE, PreferenceMeasure
    from summary import SUMMARY_KEY_DESCRIPTIONS


class ProbeReplicas(PreferenceMeasure):
    """The probes' preference: each tower's probes' mean gold log-probability of a type, tower against tower."""

    name = "summary"  # preference.json keeps its summary at the top, as the metric returns it
    label = "probe"
    method = "probes"
    question = DECODABLE
    option = None
    summary_key_descriptions = SUMMARY_KEY_DESCRIPTIONS
    report_heading = "Preference"
    report_section = None
    # the keys of the summary that the study's run.json keeps of each scored text
    study_reads = (
        "reliability", "reliability_ci", "reliability_single_probe", "num_significant", "significant_share",
        "occurrence_num_significant", "occurrence_significant_share", "two_tower_difference_nats",
        "same_tower_floor_nats", "global_offset_nats", "mean_abs_preference_nats", "num_eligible_types",
        "replicas_per_tower", "paired",
    )  # fmt: skip

    def consumer(self, model, passes):
        return None  # the engine's probe sets and their accumulators (BlockScores)

    def space_values(self, model, passages):
        return None  # the passages' gold log-probabilities are the metric's own input
