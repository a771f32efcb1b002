"""The registered measures of tower preference, in the order the report, the token view and the Space show them.

A measure is one module that declares what preference_measure.PreferenceMeasure asks; adding one is its module and
its line below (docs/development.md, "add a measure"). The first is the probes' measure, the metric's own; the others
are probe-free (TowerIntervention) and are compared with it.
"""

try:  # a module of the package; the Space's app.py imports this file from its own folder
    from .mean_ablation import MeanAblationMeasure
    from .probe_replicas import ProbeReplicas
    from .resample_ablation import ResampleAblationMeasure
except ImportError:
    from mean_ablation import MeanAblationMeasure
    from probe_replicas import ProbeReplicas
    from resample_ablation import ResampleAblationMeasure


MEASURES = (
    ProbeReplicas(),
    MeanAblationMeasure(),
    ResampleAblationMeasure(),
)
PROBE_MEASURE = MEASURES[0]
PROBE_FREE_MEASURES = MEASURES[1:]  # each compared with the probes' measure, and with each other


def probe_free_measure(name: str):
    """The registered probe-free measure called `name`."""
    for measure in PROBE_FREE_MEASURES:
        if measure.name == name:
            return measure
    raise KeyError(f"{name!r} is not a registered probe-free measure; they are {[m.name for m in PROBE_FREE_MEASURES]}.")
