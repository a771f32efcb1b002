"""
A run's output folder. One run per folder: the main process checks the folder writable and locks it for the run's
lifetime, with its PID beside the lock; a second run on the folder fails at once, on every one of its processes. The
lock file is removed when the run ends (a run killed with -9 leaves it, unlocked and harmless). Once it holds the
lock, what the run finds there: a new run never mixes with an earlier run's checkpoints or model, a resumed run
starts from a verified checkpoint taken with the same options, and the disk has room for what the run will write,
checked before the long work.
"""

import contextlib
import fcntl
import json
import os
import shutil
import socket
import tempfile
from pathlib import Path


from ..arguments import TwoTowerTrainingConfig
from ..checkpoints.checkpointing import (
    CHECKPOINTS_DIR,
    FINAL_MODEL_DIR,
    LATEST,
    check_resume_config,
    checkpoints_root,
    list_checkpoints,
    resolve_resume_checkpoint,
)
from ..feature_cache.probe_cache import CACHE_DIR
from ..utils.atomic import free_bytes, readable_bytes
from ..utils.collective import on_main_process
from ..utils.errors import TwoTowerUserError

RUNS_DIR = "runs"  # the trackers' logs (TensorBoard) and EVAL_HISTORY
EVAL_HISTORY = "eval_history.jsonl"  # every evaluation of the run: {"step", metric: value, ...} a line
RUN_OUTPUTS = (CHECKPOINTS_DIR, FINAL_MODEL_DIR, RUNS_DIR, CACHE_DIR)  # what a run writes; anything else is the user's
LOCK_NAME = ".run.lock"
HOLDER_NAME = ".run.lock.pid"  # beside the lock: the PID and host of the run holding it


def check_writable(output_dir: str | os.PathLike) -> None:
    """Create output_dir if needed and write a file in it: a folder that cannot take the run fails now."""
    folder = Path(output_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise TwoTowerUserError(
            f"--output_dir {folder} cannot be written ({error.strerror or error}): choose a folder you can write "
            f"to, or fix its permissions."
        ) from error


def _holder(folder: Path) -> str:
    try:
        pid, host = (folder / HOLDER_NAME).read_text().split()
    except (OSError, ValueError):  # the holder has not written it yet
        return "process unknown"
    return f"process {pid} on {host}"


def _lock(path: Path) -> int | None:
    """
    An open descriptor of `path` holding its exclusive flock (released by the system when the process dies), or
    None when another process holds it.
    """
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        try:
            if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                return descriptor
        except FileNotFoundError:
            pass
        # The previous holder removed the file between our open and our flock: we locked its removed copy, which
        # locks nothing. Open the file now at `path` instead.
        os.close(descriptor)


@contextlib.contextmanager
def output_dir_lock(output_dir: str | os.PathLike):
    """Hold output_dir's lock, with this process's PID beside it; when another process holds it, fail at once."""
    folder = Path(output_dir)
    descriptor = _lock(folder / LOCK_NAME)
    if descriptor is None:
        raise TwoTowerUserError(
            f"--output_dir {folder} is in use by another run ({_holder(folder)}, written in {folder / HOLDER_NAME}): "
            f"wait for it to end, or choose another --output_dir."
        )
    try:
        (folder / HOLDER_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")
        yield
    finally:
        # Removed while still locked: a process that opens it now locks a removed copy, sees that, and opens anew
        (folder / HOLDER_NAME).unlink(missing_ok=True)
        (folder / LOCK_NAME).unlink(missing_ok=True)
        os.close(descriptor)


@contextlib.contextmanager
def locked_output_dir(accelerator, output_dir: str | os.PathLike):
    """The main process checks output_dir writable and holds its lock until the run ends; every process fails if not."""
    with contextlib.ExitStack() as held:

        def take():
            check_writable(output_dir)
            held.enter_context(output_dir_lock(output_dir))

        on_main_process(accelerator, take)
        yield



def _earlier_outputs(folder: Path) -> list[Path]:
    """What an earlier run left in `folder`: its RUN_OUTPUTS that are files or folders with something in them."""
    outputs = [folder / name for name in RUN_OUTPUTS if (folder / name).exists()]
    return [path for path in outputs if not path.is_dir() or any(path.iterdir())]


def _listing(paths) -> str:
    return ", ".join(f"{Path(path).name}/" for path in paths)


def check_removable(paths) -> None:
    """Before --overwrite_output_dir removes anything: refuse a link among what it would remove (rmtree will not follow
    one, and the user's files behind it are theirs), so that nothing is removed unless all of it can be."""
    for path in paths:
        if path.is_symlink():
            raise TwoTowerUserError(
                f"--overwrite_output_dir would remove {path}, but it is a symbolic link (to {os.readlink(path)}), "
                f"whose files are not the run's to remove; nothing was removed. Move or delete the link yourself, or "
                f"choose another --output_dir."
            )


def prepare_new_run(output_dir: str | os.PathLike, overwrite_output_dir: bool) -> None:
    """
    A new run starts on an empty slate: refuse a folder that holds an earlier run's outputs, or remove them with
    --overwrite_output_dir (RUN_OUTPUTS and the final model's temporary folders, never other files).
    """
    folder = Path(output_dir)
    earlier_run = _earlier_outputs(folder)
    if earlier_run and not overwrite_output_dir:
        start_over = (f"start over with --overwrite_output_dir (removes {_listing(RUN_OUTPUTS)} and nothing else), or "
                      f"choose another --output_dir.")
        if not list_checkpoints(folder):  # a run killed before its first checkpoint: nothing to resume
            raise TwoTowerUserError(
                f"--output_dir {folder} already holds a run ({_listing(earlier_run)}) but no checkpoint to resume: "
                f"{start_over}"
            )
        raise TwoTowerUserError(
            f"--output_dir {folder} already holds a run ({_listing(earlier_run)}): resume it with "
            f"--resume_from_checkpoint latest, {start_over}"
        )
    outputs = [folder / name for name in RUN_OUTPUTS if (folder / name).exists() or (folder / name).is_symlink()]
    check_removable(outputs + list(folder.glob(f".{FINAL_MODEL_DIR}.*")))
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
    folder = Path(config.output_dir)
    earlier_run = _earlier_outputs(folder)
    if config.resume_from_checkpoint == LATEST and earlier_run and not list_checkpoints(folder):
        raise TwoTowerUserError(
            f"--resume_from_checkpoint latest: no checkpoint in {checkpoints_root(folder)}, but {folder} holds an "
            f"earlier run ({_listing(earlier_run)}): start over with --overwrite_output_dir instead of "
            f"--resume_from_checkpoint, or choose another --output_dir."
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


def run_disk_bytes(model, trained, state_copies: int) -> tuple[int, int]:
    """
    Bytes of one checkpoint (the trained module's weights, then the optimizer's state: `state_copies` copies of the
    trainable parameters, as the phase's optimizer_state_copies says) and of the final model, from the parameters.
    """
    trainable = _num_bytes(param for param in trained.parameters() if param.requires_grad)
    checkpoint_bytes = _num_bytes(trained.state_dict().values()) + state_copies * trainable
    return checkpoint_bytes, _num_bytes(model.state_dict().values())


def checkpoints_written(
    first_step: int, last_step: int, checkpointing_steps: int | None, steps_per_epoch: int, epoch_checkpoints: bool
) -> int:
    """
    How many checkpoints the loop takes after `first_step` up to `last_step`, as train_loop takes them: every
    checkpointing_steps, at each epoch's end (epoch_N; a step that is both is one checkpoint) and, when the run
    checkpoints at all, at its last step.
    """
    if not (checkpointing_steps or epoch_checkpoints):
        return 0

    def on_schedule(step: int) -> bool:
        return bool(checkpointing_steps and step % checkpointing_steps == 0) or (
            epoch_checkpoints and step % steps_per_epoch == 0
        )

    return sum(1 for step in range(first_step + 1, last_step + 1) if step == last_step or on_schedule(step))


def check_free_space(
    output_dir, checkpoint_bytes: int, model_bytes: int, checkpoints_total_limit: int, checkpoints_to_write: int
) -> None:
    """
    Refuse a run whose checkpoints and final model will not fit: of the checkpoints it writes, at most
    checkpoints_total_limit kept plus the one being written (a resumed run's existing checkpoints already hold their
    place), and the model.
    """
    folder = Path(output_dir)
    kept = len(list_checkpoints(folder))

    def new_checkpoints(limit: int) -> int:
        return min(checkpoints_to_write, max(limit + 1 - kept, 1))

    def needed(limit: int) -> int:
        return new_checkpoints(limit) * checkpoint_bytes + model_bytes

    free = free_bytes(folder)
    if needed(checkpoints_total_limit) <= free:
        return
    count = new_checkpoints(checkpoints_total_limit)
    fixes = "Free space on that disk"
    fitting = [limit for limit in range(1, checkpoints_total_limit) if needed(limit) <= free]
    if fitting:
        fixes += f", keep fewer checkpoints (--checkpoints_total_limit {fitting[-1]} fits)"
    raise TwoTowerUserError(
        f"--output_dir {folder} has {readable_bytes(free)} free but this run writes about "
        f"{readable_bytes(needed(checkpoints_total_limit))}: {count} checkpoint{'s' if count != 1 else ''} of "
        f"{readable_bytes(checkpoint_bytes)} (weights and optimizer state; of the {checkpoints_to_write} it takes, "
        f"--checkpoints_total_limit {checkpoints_total_limit} kept plus the one being written) and a model of "
        f"{readable_bytes(model_bytes)}. {fixes}, or choose another --output_dir."
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
