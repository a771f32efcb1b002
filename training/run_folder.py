"""
What a run finds in its output folder, once it holds the folder's lock: a new run never mixes with an earlier run's
checkpoints or model, a resumed run starts from a verified checkpoint taken with the same options, and the disk has
room for what the run will write, checked before the long work.
"""

import json
import os
import shutil
from pathlib import Path

import torch

from .arguments import TwoTowerTrainingConfig
from .checkpointing import (
    CHECKPOINTS_DIR,
    FINAL_MODEL_DIR,
    check_resume_config,
    list_checkpoints,
    resolve_resume_checkpoint,
)
from .errors import TwoTowerUserError
from .probe_cache import CACHE_DIR

RUNS_DIR = "runs"  # the trackers' logs (TensorBoard) and EVAL_HISTORY
EVAL_HISTORY = "eval_history.jsonl"  # every evaluation of the run: {"step", metric: value, ...} a line
RUN_OUTPUTS = (CHECKPOINTS_DIR, FINAL_MODEL_DIR, RUNS_DIR, CACHE_DIR)  # what a run writes; anything else is the user's
ADAM_MOMENTS = 2  # AdamW keeps two tensors the size of the trained parameters


def prepare_new_run(output_dir: str | os.PathLike, overwrite_output_dir: bool) -> None:
    """
    A new run starts on an empty slate: refuse a folder that holds an earlier run's outputs, or remove them with
    --overwrite_output_dir (RUN_OUTPUTS and the final model's temporary folders, never other files).
    """
    folder = Path(output_dir)
    outputs = [folder / name for name in RUN_OUTPUTS if (folder / name).exists()]
    earlier_run = [path for path in outputs if not path.is_dir() or any(path.iterdir())]
    if earlier_run and not overwrite_output_dir:
        raise TwoTowerUserError(
            f"--output_dir {folder} already holds a run ({', '.join(f'{path.name}/' for path in earlier_run)}): "
            f"resume it with --resume_from_checkpoint latest, start over with --overwrite_output_dir (removes "
            f"{', '.join(f'{name}/' for name in RUN_OUTPUTS)} and nothing else), or choose another --output_dir."
        )
    for path in outputs + list(folder.glob(f".{FINAL_MODEL_DIR}.*")):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()


def start_or_resume(config: TwoTowerTrainingConfig, num_processes: int) -> Path | None:
    """
    Main process, under the lock: a new run gets an empty folder (None); a resumed run gets its checkpoint, verified
    and taken with the same options.
    """
    if config.resume_from_checkpoint is None:
        prepare_new_run(config.output_dir, config.overwrite_output_dir)
        return None
    if config.overwrite_output_dir:
        raise TwoTowerUserError(
            "--overwrite_output_dir starts a new run and --resume_from_checkpoint continues one: drop one of them."
        )
    checkpoint = resolve_resume_checkpoint(config.resume_from_checkpoint, config.output_dir)
    check_resume_config(checkpoint, config, num_processes)
    return checkpoint


def continuation_options(output_dir: str | os.PathLike) -> dict:
    """
    For drivers that rerun an interrupted phase in its own folder (the study, benchmarks): resume its newest
    checkpoint, or start over when it saved none.
    """
    if list_checkpoints(output_dir):
        return {"resume_from_checkpoint": "latest"}
    return {"overwrite_output_dir": True}


def _num_bytes(tensors) -> int:
    unique = {tensor.data_ptr(): tensor for tensor in tensors}  # tied weights are saved once
    return sum(tensor.numel() * tensor.element_size() for tensor in unique.values())


def run_disk_bytes(model, trained, optimizer) -> tuple[int, int]:
    """
    Bytes of one checkpoint (the trained module's weights, then the optimizer's state: Adam's two moments, or
    L-BFGS's history of 2 x history_size copies and 2 more) and of the final model, from the parameters.
    """
    state_copies = ADAM_MOMENTS
    if isinstance(optimizer, torch.optim.LBFGS):
        state_copies = 2 * optimizer.defaults["history_size"] + 2
    trainable = _num_bytes(param for param in trained.parameters() if param.requires_grad)
    checkpoint_bytes = _num_bytes(trained.state_dict().values()) + state_copies * trainable
    return checkpoint_bytes, _num_bytes(model.state_dict().values())


def free_bytes(folder: Path) -> int:
    return shutil.disk_usage(folder).free


def readable_bytes(num_bytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if num_bytes < 1000:
            return f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    return f"{num_bytes:.1f} TB"


def check_free_space(output_dir, checkpoint_bytes: int, model_bytes: int, checkpoints_total_limit: int) -> None:
    """
    Refuse a run whose checkpoints and final model will not fit: K checkpoints kept plus the one being written (a
    resumed run's existing checkpoints already take their place) and the model.
    """
    folder = Path(output_dir)
    new_checkpoints = max(checkpoints_total_limit + 1 - len(list_checkpoints(folder)), 0)
    needed, free = new_checkpoints * checkpoint_bytes + model_bytes, free_bytes(folder)
    if needed > free:
        raise TwoTowerUserError(
            f"--output_dir {folder} has {readable_bytes(free)} free but this run writes about "
            f"{readable_bytes(needed)}: {new_checkpoints} checkpoints of {readable_bytes(checkpoint_bytes)} (weights "
            f"and optimizer state; --checkpoints_total_limit {checkpoints_total_limit} kept, plus the one being "
            f"written) and a model of {readable_bytes(model_bytes)}. Free space on that disk, lower "
            f"--checkpoints_total_limit, or choose another --output_dir."
        )


def read_eval_history(output_dir) -> list[dict]:
    """A run's evaluations in step order, from runs/eval_history.jsonl; of a step evaluated twice (a run killed after
    evaluating and resumed from an earlier checkpoint), the last."""
    path = Path(output_dir) / RUNS_DIR / EVAL_HISTORY
    if not path.is_file():
        return []
    by_step = {}
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        by_step[entry["step"]] = entry
    return [by_step[step] for step in sorted(by_step)]
