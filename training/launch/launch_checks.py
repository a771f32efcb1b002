"""
What a launch gives a run, checked before any long work: one source of mixed precision and every launched process
seen by Accelerate (the distributed types a phase can train under are the phase's to check: training/phases/).
"""

import os

from ..arguments import TwoTowerTrainingConfig
from ..utils.errors import TwoTowerUserError

LAUNCH_PRECISION_VARIABLE = "ACCELERATE_MIXED_PRECISION"  # what `accelerate launch` sets from its config or flag


def resolve_mixed_precision(config: TwoTowerTrainingConfig) -> tuple[str | None, str]:
    """
    (the precision to pass to Accelerator, where it comes from). `--mixed_precision` (recipe or command line) and the
    accelerate launch's `mixed_precision` may each be unset; set to different values, they are refused, since
    either silently overriding the other trains in a precision the user did not choose.
    """
    launched = os.environ.get(LAUNCH_PRECISION_VARIABLE)
    if config.mixed_precision is None:
        return launched, "the accelerate launch" if launched is not None else "the default"
    if launched is not None and launched != config.mixed_precision:
        raise TwoTowerUserError(
            f"--mixed_precision {config.mixed_precision} (recipe {config.recipe or 'none'} or the command line) "
            f"disagrees with the accelerate launch's mixed_precision {launched} (its --config_file or "
            f"--mixed_precision); pass --mixed_precision {launched} to the training command, or launch with "
            f"--mixed_precision {config.mixed_precision}."
        )
    return config.mixed_precision, "--mixed_precision"


def check_launch(accelerator) -> None:
    """Refuse a launch whose processes would not train together."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched > accelerator.num_processes:
        raise TwoTowerUserError(
            f"{launched} processes were launched (WORLD_SIZE={launched}) but Accelerate sees "
            f"{accelerator.num_processes} ({accelerator.distributed_type}), so each would train alone. On a machine "
            f"without GPUs add --cpu true to the training command (`accelerate launch --cpu` itself starts one process "
            f"without mpirun); on GPUs, check that every process sees one (CUDA_VISIBLE_DEVICES)."
        )
