"""
Checkpoints of a run (accelerate `save_state`, keep the last K, resume) and the atomic save of the final model.

A checkpoint folder holds accelerate's state (weights, optimizer, scheduler, every process's RNG states), the
tokenizer, the resolved config, the fingerprint of the data, `progress.json` (where in the run it was taken) and,
written last, a checksum manifest of all of them. Every folder is written under a temporary name and renamed when
complete, so a crash never leaves a folder that looks complete but is not; the manifest catches a file changed
afterwards (a truncated copy, a failing disk), and the RNG state files are read without unpickling objects before
accelerate loads them. A resumed run must match the checkpoint's options and data wherever they change the result.
"""

import dataclasses
import json
import logging
import os
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import yaml
from accelerate.utils import RNG_STATE_NAME

from ..arguments import RESOLVED_CONFIG_NAME, TwoTowerTrainingConfig, save_config
from ..data.blocks import data_file_paths
from ..utils.atomic import (
    RUN_AGAIN,
    apply_umask_to_folder,
    disk_full_error,
    free_bytes,
    fresh_staging_folder,
    is_disk_full,
    readable_bytes,
    replace_folder,
)
from ..utils.collective import raise_together
from ..utils.errors import TwoTowerUserError
from .resume_limits import check_resumable_options
from .manifest import MANIFEST_NAME, files_fingerprint, manifest_problem, write_manifest

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
FINAL_MODEL_DIR = "model"
PROGRESS_NAME = "progress.json"
DATA_FINGERPRINT_NAME = "data_fingerprint.json"  # what the run trained on, beside its config
# What a weights-only load must be allowed to build for NumPy's RNG state (a tuple holding a uint32 array), no more;
# the first is how numpy pickles an array (`_reconstruct`, in numpy.core before numpy 2, numpy._core since)
NUMPY_RNG_STATE_GLOBALS = [np.ndarray(0).__reduce__()[0], np.ndarray, np.dtype, np.dtypes.UInt32DType]
LATEST = "latest"
# Options that leave what a run computes unchanged: a resumed run may change them. Any other difference from the
# checkpoint's options (seed, data, model, schedule, batch geometry, phase, probes, evaluation...) is refused.
RESULT_NEUTRAL_OPTIONS = (
    "recipe",  # resuming with `--recipe CHECKPOINT/training_config.yaml` names another file for the same options
    "output_dir", "resume_from_checkpoint", "overwrite_output_dir", "allow_config_change",
    "checkpointing_steps", "checkpoints_total_limit",  # saving reads the state, never changes it
    "logging_steps", "report_to", "peak_tflops", "disable_tqdm",
    "preprocessing_num_workers", "overwrite_cache",  # tokenizing is deterministic, cached or not
    "push_to_hub", "hub_model_id", "hub_private_repo",
)


def checkpoints_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def read_progress(checkpoint: Path) -> dict:
    """{"completed_steps", "epoch", "batches_into_epoch", "steps_per_epoch"} of a checkpoint folder."""
    return json.loads((checkpoint / PROGRESS_NAME).read_text())


def checkpoint_num_processes(checkpoint: Path) -> int:
    """How many processes took the checkpoint: each saved its own RNG states."""
    return len(list(checkpoint.glob(f"{RNG_STATE_NAME}_*.pkl")))


def _completed_steps(checkpoint: Path) -> int | None:
    """The step a checkpoint was taken at, or None when its progress.json is missing or cannot be read."""
    try:
        return int(read_progress(checkpoint)["completed_steps"])
    except (OSError, ValueError, KeyError, TypeError):  # JSON and encoding errors are ValueErrors
        return None


def _checkpoint_folders(root: Path) -> list[Path]:
    """Every folder under checkpoints/ but the temporary ones of a save in progress or interrupted."""
    if not root.is_dir():
        return []
    return [path for path in root.iterdir() if path.is_dir() and not path.name.startswith(".")]


def _sorted_checkpoints(root: Path) -> list[Path]:
    steps = {path: _completed_steps(path) for path in _checkpoint_folders(root)}
    return sorted((path for path, step in steps.items() if step is not None), key=lambda path: (steps[path], path.name))


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Checkpoints of a run whose progress.json reads, oldest first."""
    return _sorted_checkpoints(checkpoints_root(output_dir))


def _check_step(step) -> None:
    if not isinstance(step, int) or isinstance(step, bool):
        raise TypeError(step)


def _check_cuda_states(states) -> None:
    byte_tensors = isinstance(states, list) and all(
        isinstance(state, torch.Tensor) and state.dtype == torch.uint8 for state in states
    )
    if not byte_tensors:
        raise TypeError(states)


# The random states accelerate's save_state writes and load_state sets (accelerate/checkpointing.py), each checked by
# setting it on a scratch generator; `step` and the CUDA states are there when the run had them
REQUIRED_RNG_STATES = {
    "random_state": lambda state: random.Random().setstate(state),
    "numpy_random_seed": lambda state: np.random.RandomState().set_state(state),
    "torch_manual_seed": lambda state: torch.Generator().set_state(state),
}
OPTIONAL_RNG_STATES = {"step": _check_step, "torch_cuda_manual_seed": _check_cuda_states}


def rng_states_problem(path: Path) -> str | None:
    """
    What keeps accelerate's load_state from setting the random states in `path` (it would skip them with one info
    line and go on), or None. Read weights-only: the objects of a crafted pickle are never built.
    """
    try:
        with torch.serialization.safe_globals(NUMPY_RNG_STATE_GLOBALS):
            states = torch.load(path, weights_only=True)
    except pickle.UnpicklingError:
        return (f"{path} does not hold random states only: it holds objects that a weights-only load refuses to "
                f"build (a crafted or foreign file), so none was built")
    except Exception as error:  # any other failure to read it: cut short, empty, not a torch file
        return (f"{path} does not hold random states torch can read ({type(error).__name__}: cut short, or not a "
                f"torch file)")
    missing = [key for key in REQUIRED_RNG_STATES if not isinstance(states, dict) or key not in states]
    if missing:
        return f"{path} does not hold the random states accelerate saves (no {', '.join(missing)})"
    present = {key: check for key, check in {**REQUIRED_RNG_STATES, **OPTIONAL_RNG_STATES}.items() if key in states}
    for key, check in present.items():
        try:
            check(states[key])
        except (TypeError, ValueError, RuntimeError, OverflowError):
            return f"{path} does not hold a valid `{key}` random state"
    return None


def checkpoint_problem(checkpoint: Path) -> str | None:
    """What keeps `checkpoint` from resuming exactly (naming the file), or None: the manifest and the RNG states."""
    problem = manifest_problem(checkpoint)
    if problem is not None:
        return problem
    states_problems = (rng_states_problem(path) for path in sorted(checkpoint.glob(f"{RNG_STATE_NAME}_*.pkl")))
    return next((problem for problem in states_problems if problem is not None), None)


def previous_checkpoint(checkpoint: Path) -> Path | None:
    """The newest checkpoint before `checkpoint` in its folder that verifies: the one to try instead."""
    step = _completed_steps(checkpoint)
    earlier = [
        path for path in _sorted_checkpoints(checkpoint.parent)
        if path.resolve() != checkpoint.resolve() and (step is None or _completed_steps(path) < step)
    ]
    return next((path for path in reversed(earlier) if checkpoint_problem(path) is None), None)


def _what_to_try(checkpoint: Path) -> str:
    previous = previous_checkpoint(checkpoint)
    if previous is None:
        return "no earlier checkpoint verifies: start over with --overwrite_output_dir"
    return f"resume from the previous checkpoint instead: --resume_from_checkpoint {previous}"


def resolve_resume_checkpoint(resume_from_checkpoint: str, output_dir: str | os.PathLike) -> Path:
    """
    `latest` -> the newest checkpoint in output_dir/checkpoints that verifies (`checkpoint_problem`; a checkpoint
    that does not, or whose progress.json cannot be read, is skipped with a warning naming the file); a folder -> that
    checkpoint, verified.
    """
    root = checkpoints_root(output_dir)
    if resume_from_checkpoint == LATEST:
        checkpoints = list_checkpoints(output_dir)
        for unreadable in sorted(set(_checkpoint_folders(root)) - set(checkpoints)):
            logger.warning(f"Skipping {unreadable}: its {unreadable / PROGRESS_NAME} is missing or cannot be read.")
        if not checkpoints:
            raise TwoTowerUserError(
                f"--resume_from_checkpoint latest: no checkpoint in {root}; check --output_dir, or drop the option "
                f"to start a new run."
            )
        problems = []
        for checkpoint in reversed(checkpoints):
            problem = checkpoint_problem(checkpoint)
            if problem is None:
                return checkpoint
            logger.warning(f"Skipping checkpoint {checkpoint}: {problem}.")
            problems.append(problem)
        raise TwoTowerUserError(
            f"--resume_from_checkpoint latest: no checkpoint in {root} verifies ({'; '.join(problems)}); start over "
            f"with --overwrite_output_dir."
        )
    checkpoint = Path(resume_from_checkpoint)
    if not any((checkpoint / name).is_file() for name in (PROGRESS_NAME, MANIFEST_NAME)):
        raise TwoTowerUserError(
            f"--resume_from_checkpoint {resume_from_checkpoint!r} is not a checkpoint folder (no {PROGRESS_NAME}); "
            f"pass a folder under {root} or `latest`."
        )
    problem = checkpoint_problem(checkpoint)
    if problem is not None:
        raise TwoTowerUserError(f"Cannot resume from {checkpoint}: {problem}; {_what_to_try(checkpoint)}.")
    return checkpoint


def resume_config_differences(checkpoint: Path, config: TwoTowerTrainingConfig, num_processes: int) -> list[str]:
    """The options that change the result and differ from the checkpoint's, as `name: checkpoint's -> this run's`."""
    saved = yaml.safe_load((checkpoint / RESOLVED_CONFIG_NAME).read_text())
    saved["num_processes"] = checkpoint_num_processes(checkpoint)  # part of the global batch
    current = {**dataclasses.asdict(config), "num_processes": num_processes}
    defaults = {field.name: field.default for field in dataclasses.fields(config)}  # options newer than the checkpoint
    return [
        f"{name}: {saved.get(name, defaults.get(name))!r} -> {value!r}"
        for name, value in current.items()
        if name not in RESULT_NEUTRAL_OPTIONS and saved.get(name, defaults.get(name)) != value
    ]


def _data_files(spec: str) -> list[str]:
    """
    The files of a --train_file/--validation_file (a file, a folder of .txt files or a glob), as data/blocks.py's
    resolve_text_files finds them, without its read of every file: the fingerprint is taken at every checkpoint.
    Files gone since the run started are none (their change is named against the checkpoint's fingerprint).
    """
    try:
        return [str(path) for path in data_file_paths(spec)]
    except FileNotFoundError:
        return []


def data_fingerprint(config: TwoTowerTrainingConfig) -> dict[str, dict]:
    """
    What a run trains on, by source: each local data file -> its size and sha256 (hashed once per run, see
    `files_fingerprint`); a Hub dataset -> its config (the package pins no revision).
    """
    if config.train_file is None:
        return {f"Hub dataset {config.dataset_name}": {"config": config.dataset_config_name}}
    specs = [spec for spec in (config.train_file, config.validation_file) if spec is not None]
    return files_fingerprint([file for spec in specs for file in _data_files(spec)])


def _field_change(field: str, old, new) -> str:
    if field == "sha256":  # enough of it to tell the two apart
        old, new = str(old)[:12], str(new)[:12]
    return f"{field} {old} -> {new}"


def resume_data_changes(checkpoint: Path, config: TwoTowerTrainingConfig) -> list[str]:
    """How this run's data differs from the checkpoint's fingerprint, one entry a source (a file, a Hub dataset)."""
    path = checkpoint / DATA_FINGERPRINT_NAME
    if not path.is_file():  # taken before checkpoints recorded their data
        return []
    saved, current = json.loads(path.read_text()), data_fingerprint(config)
    changes = [f"{source} is gone" for source in saved if source not in current]
    changes += [f"{source} is new" for source in current if source not in saved]
    for source, identity in current.items():
        old = saved.get(source, identity)
        fields = [
            _field_change(name, old.get(name), value) for name, value in identity.items() if old.get(name) != value
        ]
        if fields:
            changes.append(f"{source} changed ({', '.join(fields)})")
    return changes


def check_resume_config(checkpoint: Path, config: TwoTowerTrainingConfig, num_processes: int) -> None:
    """Refuse to resume `checkpoint` with options or data that change the result, unless --allow_config_change."""
    check_resumable_options(checkpoint, config)
    options = "; ".join(resume_config_differences(checkpoint, config, num_processes))
    _refuse_unless_allowed(
        options,
        config.allow_config_change,
        f"Resuming {checkpoint} with options changed (checkpoint's -> this run's): {options}.",
        f"{checkpoint} was taken with other options that change the result (checkpoint's -> this run's): "
        f"{options}. Resume with the checkpoint's options (--recipe {checkpoint / RESOLVED_CONFIG_NAME}), or pass "
        f"--allow_config_change to resume with the new ones.",
    )
    data = "; ".join(resume_data_changes(checkpoint, config))
    _refuse_unless_allowed(
        data,
        config.allow_config_change,
        f"Resuming {checkpoint} on other data: {data}.",
        f"{checkpoint} was taken on other data: {data}. Resume on the data it was taken on, or pass "
        f"--allow_config_change to resume on this data.",
    )


def _refuse_unless_allowed(changes: str, allowed: bool, warning: str, error: str) -> None:
    if not changes:
        return
    if not allowed:
        raise TwoTowerUserError(error)
    logger.warning(warning)


def is_finished(checkpoint: Path, config: TwoTowerTrainingConfig) -> bool:
    """Whether output_dir holds the final model and `checkpoint` is at the run's last step: nothing is left to do."""
    progress = read_progress(checkpoint)
    max_train_steps = config.max_train_steps or config.num_train_epochs * progress["steps_per_epoch"]
    final_model = Path(config.output_dir) / FINAL_MODEL_DIR / "config.json"
    return final_model.is_file() and progress["completed_steps"] >= max_train_steps


def _bytes_in(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def _write_atomically(accelerator, final: Path, write, seal=None, disk_full_advice=lambda free: RUN_AGAIN) -> None:
    """
    Run `write(folder)` on every process into a temporary sibling of `final`, then (main process) `seal(folder)`,
    give its files the user's umask and rename it to `final`. Any failure removes the temporary folder and raises on
    every process; a full disk raises one line naming `final`, then `disk_full_advice(bytes free once the partial
    copy is removed)`.
    """
    tmp = final.with_name(f".{final.name}.tmp")

    def attempt(step) -> Exception | None:
        try:
            step()
        except Exception as error:
            if is_disk_full(error, tmp):  # tmp's disk: torch.save's writer fails without naming the cause
                failure = disk_full_error(final, tmp, disk_full_advice(free_bytes(tmp) + _bytes_in(tmp)))
                failure.__cause__ = error
                return failure
            return error
        return None

    def seal_and_rename():
        if seal is not None:
            seal(tmp)
        apply_umask_to_folder(tmp)  # safetensors writes its files private (0600)
        replace_folder(tmp, final)

    if accelerator.is_main_process:
        fresh_staging_folder(final)
    accelerator.wait_for_everyone()
    try:
        raise_together(accelerator, attempt(lambda: write(tmp)))  # every process has written its part
        raise_together(accelerator, attempt(seal_and_rename) if accelerator.is_main_process else None)
    except Exception:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        raise


def save_checkpoint(
    accelerator, name: str, progress: dict, tokenizer, config: TwoTowerTrainingConfig, total_limit: int
) -> Path:
    """save_state into output_dir/checkpoints/NAME with tokenizer, config, progress and manifest; keep the newest K."""
    final = checkpoints_root(config.output_dir) / name

    def write(folder: Path):
        accelerator.save_state(str(folder))  # every process writes its own RNG state
        if accelerator.is_main_process:
            tokenizer.save_pretrained(folder)
            save_config(config, folder)
            (folder / DATA_FINGERPRINT_NAME).write_text(json.dumps(data_fingerprint(config), indent=2))
            (folder / PROGRESS_NAME).write_text(json.dumps(progress, indent=2))

    _write_atomically(accelerator, final, write, seal=write_manifest)
    if accelerator.is_main_process:
        for stale in list_checkpoints(config.output_dir)[:-total_limit]:
            shutil.rmtree(stale)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, checkpoint: Path, steps_per_epoch: int) -> dict:
    """Restore accelerate's state from a verified `checkpoint`; returns its progress, checked against this run."""
    progress = read_progress(checkpoint)
    if progress["steps_per_epoch"] != steps_per_epoch:
        raise TwoTowerUserError(
            f"{checkpoint} was taken with {progress['steps_per_epoch']} optimizer steps per epoch, this run has "
            f"{steps_per_epoch}: the data, batch size, accumulation or number of processes changed. Resume with "
            f"the checkpoint's training_config.yaml (--recipe {checkpoint / RESOLVED_CONFIG_NAME})."
        )
    # Verified beforehand: load_state skips an RNG state file it cannot read with one info line, and goes on
    accelerator.load_state(str(checkpoint))
    return progress


def save_final_model(
    accelerator, model, state_dict: dict, tokenizer, config: TwoTowerTrainingConfig, records: dict | None = None
) -> Path:
    """
    save_pretrained (Hub layout, custom code) + tokenizer + resolved config (with the run's `records`, see
    `save_config`) into output_dir/model, atomically.
    """
    final = Path(config.output_dir) / FINAL_MODEL_DIR
    model_bytes = sum(tensor.numel() * tensor.element_size() for tensor in state_dict.values())

    def write(folder: Path):
        model.save_pretrained(folder, state_dict=state_dict, is_main_process=accelerator.is_main_process)
        if accelerator.is_main_process:
            tokenizer.save_pretrained(folder)
            save_config(config, folder, records)

    def disk_full_advice(free: int) -> str:
        """The run's last checkpoint holds everything but the model: resuming it only saves the model."""
        needs = f"The model needs about {readable_bytes(model_bytes)} and the disk has {readable_bytes(free)} free."
        checkpoints = list_checkpoints(config.output_dir)
        if not checkpoints:
            return f"{needs} {RUN_AGAIN}"
        return (f"{needs} The run's state at step {read_progress(checkpoints[-1])['completed_steps']} is kept in "
                f"{checkpoints[-1]}: free space, then run the same command with --resume_from_checkpoint {LATEST}.")

    _write_atomically(accelerator, final, write, disk_full_advice=disk_full_advice)
    return final
