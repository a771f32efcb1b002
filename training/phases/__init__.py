"""
What each training phase does, chosen once per run (`make_phase`): `PretrainPhase` trains a new joint model,
`ProbePhase` the MLP probes of a frozen pretrained model on its towers' features, `LinearProbePhase` linear probes by
full-batch L-BFGS. The run's preparation (run/run_setup.py) and the loop (train.py) call the same methods whatever the
phase; this package is the one place that tells the phases apart, a module a phase, each with its own optimizer,
beside the validation they share (validation.py).
"""

from ..arguments import TwoTowerTrainingConfig
from .base import TrainingPhase, trained_state_dict
from .linear_probe import LinearProbePhase
from .pretrain import PretrainPhase
from .probe import ProbePhase, ProbesOnPositions


def make_phase(config: TwoTowerTrainingConfig) -> TrainingPhase:
    """The phase `config` asks for: the one choice every other step of the run follows."""
    if config.phase == "pretrain":
        return PretrainPhase(config)
    return LinearProbePhase(config) if config.probe_type == "linear" else ProbePhase(config)


__all__ = ["LinearProbePhase", "PretrainPhase", "ProbePhase", "ProbesOnPositions", "TrainingPhase", "make_phase",
           "trained_state_dict"]
