"""
Options a checkpoint cannot be resumed with, even with --allow_config_change: they change what the checkpoint's place
in its epoch means (which blocks each probe replica reads) or the shapes of the state it holds (how many probes). They
are refused when the checkpoint is chosen, before any text is tokenized or any feature cached.
"""

from pathlib import Path

import yaml

from ..arguments import RESOLVED_CONFIG_NAME, TwoTowerTrainingConfig
from ..utils.errors import TwoTowerUserError

# option -> what a change of it changes, for the message
UNRESUMABLE_OPTIONS = {
    "probe_replica_data": "which blocks each probe replica reads, so the checkpoint's place in its epoch has no "
                          "meaning in the new order",
    "probe_replicas": "the number of probes, so the checkpoint's probes and optimizer state do not fit the run",
}


def check_resumable_options(checkpoint: Path, config: TwoTowerTrainingConfig) -> None:
    """Raise TwoTowerUserError when a probe checkpoint is resumed with an option of UNRESUMABLE_OPTIONS changed."""
    saved = yaml.safe_load((checkpoint / RESOLVED_CONFIG_NAME).read_text()) or {}
    if config.phase != "probe" or saved.get("phase") != "probe":
        return
    for option, reason in UNRESUMABLE_OPTIONS.items():
        before, now = saved.get(option, getattr(TwoTowerTrainingConfig, option)), getattr(config, option)
        one_replica = saved.get("probe_replicas", 1) == config.probe_replicas == 1  # disjoint = shared for one
        if before == now or (option == "probe_replica_data" and one_replica):
            continue
        raise TwoTowerUserError(
            f"--{option} {now} cannot resume {checkpoint}, which was taken with --{option} {before}, even with "
            f"--allow_config_change: it changes {reason}. Resume with --{option} {before}, or start a new run with "
            f"--overwrite_output_dir (or another --output_dir)."
        )
