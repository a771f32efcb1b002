"""
Checkpoints of a run (accelerate `save_state`, keep the last K, resume) and the atomic save of the final model.

A checkpoint folder holds accelerate's state (weights, optimizer, scheduler, every process's RNG states), the
tokenizer, the resolved config, `progress.json` (where in the run it was taken) and, written last, a checksum
manifest of all of them. Every folder is written under a temporary name and renamed when complete, so a crash never
leaves a folder that looks complete but is not; the manifest catches a file changed afterwards (a truncated copy, a
failing disk). A resumed run must match the checkpoint's options wherever they change the result.
"""

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path

import yaml
from accelerate.utils import RNG_STATE_NAME

from .arguments import RESOLVED_CONFIG_NAME, TwoTowerTrainingConfig, save_config
from .atomic import disk_full_error, fresh_staging_folder, is_disk_full, replace_folder
from .collective import raise_together
from .errors import TwoTowerUserError
from .manifest import MANIFEST_NAME, manifest_problem, write_manifest

logger = logging.getLogger(__name__)

CHECKPOINTS_DIR = "checkpoints"
FINAL_MODEL_DIR = "model"
PROGRESS_NAME = "progress.json"
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


def previous_checkpoint(checkpoint: Path) -> Path | None:
    """The newest checkpoint before `checkpoint` in its folder whose manifest verifies: the one to try instead."""
    step = _completed_steps(checkpoint)
    earlier = [
        path for path in _sorted_checkpoints(checkpoint.parent)
        if path.resolve() != checkpoint.resolve() and (step is None or _completed_steps(path) < step)
    ]
    return next((path for path in reversed(earlier) if manifest_problem(path) is None), None)


def _what_to_try(checkpoint: Path) -> str:
    previous = previous_checkpoint(checkpoint)
    if previous is None:
        return "no earlier checkpoint verifies: start over with --overwrite_output_dir"
    return f"resume from the previous checkpoint instead: --resume_from_checkpoint {previous}"


def resolve_resume_checkpoint(resume_from_checkpoint: str, output_dir: str | os.PathLike) -> Path:
    """
    `latest` -> the newest checkpoint in output_dir/checkpoints whose manifest verifies (a checkpoint that does not,
    or whose progress.json cannot be read, is skipped with a warning naming the file); a folder -> that checkpoint,
    verified.
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
            problem = manifest_problem(checkpoint)
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
    problem = manifest_problem(checkpoint)
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


def check_resume_config(checkpoint: Path, config: TwoTowerTrainingConfig, num_processes: int) -> None:
    """Refuse to resume `checkpoint` with options that change the result, unless --allow_config_change."""
    differences = resume_config_differences(checkpoint, config, num_processes)
    if not differences:
        return
    listing = "; ".join(differences)
    if config.allow_config_change:
        logger.warning(f"Resuming {checkpoint} with options changed (checkpoint's -> this run's): {listing}.")
        return
    raise TwoTowerUserError(
        f"{checkpoint} was taken with other options that change the result (checkpoint's -> this run's): "
        f"{listing}. Resume with the checkpoint's options (--recipe {checkpoint / RESOLVED_CONFIG_NAME}), or pass "
        f"--allow_config_change to resume with the new ones."
    )


def is_finished(checkpoint: Path, config: TwoTowerTrainingConfig) -> bool:
    """Whether output_dir holds the final model and `checkpoint` is at the run's last step: nothing is left to do."""
    progress = read_progress(checkpoint)
    max_train_steps = config.max_train_steps or config.num_train_epochs * progress["steps_per_epoch"]
    final_model = Path(config.output_dir) / FINAL_MODEL_DIR / "config.json"
    return final_model.is_file() and progress["completed_steps"] >= max_train_steps


def _write_atomically(accelerator, final: Path, write, seal=None) -> None:
    """
    Run `write(folder)` on every process into a temporary sibling of `final`, then (main process) `seal(folder)` and
    rename it to `final`. Any failure removes the temporary folder and raises on every process; a full disk raises
    one line naming `final`.
    """
    tmp = final.with_name(f".{final.name}.tmp")

    def attempt(step) -> Exception | None:
        try:
            step()
        except Exception as error:
            if is_disk_full(error):
                failure = disk_full_error(final, tmp)
                failure.__cause__ = error
                return failure
            return error
        return None

    def seal_and_rename():
        if seal is not None:
            seal(tmp)
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

    def write(folder: Path):
        model.save_pretrained(folder, state_dict=state_dict, is_main_process=accelerator.is_main_process)
        if accelerator.is_main_process:
            tokenizer.save_pretrained(folder)
            save_config(config, folder, records)

    _write_atomically(accelerator, final, write)
    return final
