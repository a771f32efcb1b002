"""Checkpoints of a run (accelerate `save_state`, keep the last K, resume) and the atomic save of the final model.

A checkpoint folder holds accelerate's state (weights, optimizer, scheduler, RNG states), the tokenizer, the
resolved config, and `progress.json` (where in the run it was taken). Every folder is written under a temporary
name and renamed when complete, so a crash never leaves a folder that looks complete but is not.
"""

import json
import os
import shutil
from pathlib import Path

from .atomic import fresh_staging_folder, replace_folder
from .arguments import TwoTowerTrainingConfig, save_config

CHECKPOINTS_DIR = "checkpoints"
FINAL_MODEL_DIR = "model"
PROGRESS_NAME = "progress.json"
LATEST = "latest"


def checkpoints_root(output_dir: str | os.PathLike) -> Path:
    return Path(output_dir) / CHECKPOINTS_DIR


def read_progress(checkpoint: Path) -> dict:
    """{"completed_steps", "epoch", "batches_into_epoch", "steps_per_epoch"} of a checkpoint folder."""
    return json.loads((checkpoint / PROGRESS_NAME).read_text())


def list_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary folders of an interrupted save are skipped)."""
    root = checkpoints_root(output_dir)
    if not root.is_dir():
        return []
    complete = [path for path in root.iterdir() if (path / PROGRESS_NAME).is_file() and not path.name.startswith(".")]
    return sorted(complete, key=lambda path: (read_progress(path)["completed_steps"], path.name))


def resolve_resume_checkpoint(resume_from_checkpoint: str, output_dir: str | os.PathLike) -> Path:
    """`latest` -> the newest checkpoint in output_dir/checkpoints; a path -> that checkpoint, checked."""
    if resume_from_checkpoint == LATEST:
        checkpoints = list_checkpoints(output_dir)
        if not checkpoints:
            raise FileNotFoundError(
                f"--resume_from_checkpoint latest: no checkpoint in {checkpoints_root(output_dir)}; "
                f"check --output_dir, or drop the option to start a new run."
            )
        return checkpoints[-1]
    checkpoint = Path(resume_from_checkpoint)
    if not (checkpoint / PROGRESS_NAME).is_file():
        raise FileNotFoundError(
            f"--resume_from_checkpoint {resume_from_checkpoint!r} is not a checkpoint folder (no {PROGRESS_NAME}); "
            f"pass a folder under {checkpoints_root(output_dir)} or `latest`."
        )
    return checkpoint


def _write_atomically(accelerator, final: Path, write) -> None:
    """Run `write(folder)` on a temporary sibling of `final`, then rename it to `final` (main process renames)."""
    tmp = final.with_name(f".{final.name}.tmp")
    if accelerator.is_main_process:
        fresh_staging_folder(final)
    accelerator.wait_for_everyone()
    write(tmp)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        replace_folder(tmp, final)
    accelerator.wait_for_everyone()


def save_checkpoint(
    accelerator, name: str, progress: dict, tokenizer, config: TwoTowerTrainingConfig, total_limit: int
) -> Path:
    """save_state into output_dir/checkpoints/NAME with tokenizer, config and progress; keep the newest K."""
    final = checkpoints_root(config.output_dir) / name
    final.parent.mkdir(parents=True, exist_ok=True)

    def write(folder: Path):
        accelerator.save_state(str(folder))  # every process writes its own RNG state
        if accelerator.is_main_process:
            tokenizer.save_pretrained(folder)
            save_config(config, folder)
            (folder / PROGRESS_NAME).write_text(json.dumps(progress, indent=2))

    _write_atomically(accelerator, final, write)
    if accelerator.is_main_process:
        for stale in list_checkpoints(config.output_dir)[:-total_limit]:
            shutil.rmtree(stale)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, checkpoint: Path, steps_per_epoch: int) -> dict:
    """Restore accelerate's state from `checkpoint`; returns its progress, checked against this run's data."""
    progress = read_progress(checkpoint)
    if progress["steps_per_epoch"] != steps_per_epoch:
        raise ValueError(
            f"{checkpoint} was taken with {progress['steps_per_epoch']} optimizer steps per epoch, this run has "
            f"{steps_per_epoch}: the data, batch size, accumulation or number of processes changed. Resume with "
            f"the checkpoint's training_config.yaml (--recipe {checkpoint / 'training_config.yaml'})."
        )
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
