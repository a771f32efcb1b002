"""One run per output folder: the lock, a reused folder, a folder that cannot be written or is too small, full disks."""

import dataclasses
import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from accelerate import Accelerator
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from conftest import HANG_LIMIT_S
import modeling_twotower
from test_training import corpus, tiny_config  # noqa: F401 (corpus is a fixture)
from twotower.training.run import run_folder
from twotower.training.arguments import load_config
from twotower.training.utils.atomic import write_atomically, write_text_atomically
from twotower.training.checkpoints.checkpointing import list_checkpoints
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.run.run_folder import output_dir_lock
from twotower.training.phases import make_phase
from twotower.training.run.run_folder import EVAL_HISTORY, read_eval_history, readable_bytes, run_disk_bytes
from twotower.training.train import training_function

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def small_config(corpus: dict, output_dir: Path, **overrides):
    """4 steps per epoch (32 blocks of 8), 6 steps, checkpoints at steps 2, 4 (epoch_0) and 6."""
    options = dict(max_train_blocks=32, gradient_accumulation_steps=1, max_train_steps=6, checkpointing_steps=2,
                   report_to="none")
    return tiny_config("tiny", corpus, output_dir, **{**options, **overrides})


def without_step_checkpoints(config):
    """The config with --checkpointing_steps unset (a command line cannot unset it): epoch checkpoints only."""
    return dataclasses.replace(config, checkpointing_steps=None)


@pytest.fixture(scope="module")
def seed_runs(corpus, tmp_path_factory) -> dict:
    """The same run with seeds 1 and 2, each in a folder of its own."""
    root = tmp_path_factory.mktemp("seeds")
    return {seed: training_function(small_config(corpus, root / f"seed{seed}", seed=seed)) for seed in (1, 2)}


def weights(output_dir) -> dict:
    return load_file(Path(output_dir) / "model" / "model.safetensors")


def bitwise_equal(first: dict, second: dict) -> bool:
    return first.keys() == second.keys() and all(torch.equal(tensor, second[name]) for name, tensor in first.items())


HOLD_LOCK = """
import sys
from twotower.training.run.run_folder import output_dir_lock
with output_dir_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_second_run_on_a_locked_folder_fails_at_once_naming_the_holder(corpus, tmp_path):
    tmp_path.joinpath("run").mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(tmp_path / "run")], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        start = time.perf_counter()
        with pytest.raises(TwoTowerUserError) as raised:
            training_function(small_config(corpus, tmp_path / "run"))
        assert time.perf_counter() - start < 10  # at once, not after the data and the model
    finally:
        holder.kill()  # kill -9: the system releases its lock; its PID file stays behind, harmless
        holder.wait(timeout=HANG_LIMIT_S)
    message = str(raised.value)
    assert f"--output_dir {tmp_path / 'run'} is in use by another run (process {holder.pid} on " in message
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "model").exists()
    # The folder is free again at once, and each run releases the lock when it ends.
    training_function(small_config(corpus, tmp_path / "run", max_train_steps=1))
    with output_dir_lock(tmp_path / "run"):
        pass


LOCK_ON_TWO_PROCESSES = """
import sys
from accelerate import Accelerator
from twotower.training.run.run_folder import locked_output_dir
with locked_output_dir(Accelerator(cpu=True), sys.argv[1]):
    print("locked", flush=True)
"""


@pytest.mark.slow
def test_every_process_of_a_run_fails_on_a_locked_folder(tmp_path):
    # training_function's first step, on 2 processes (gloo): only rank 0 tries the lock, rank 1 learns from it.
    (tmp_path / "lock_on_two_processes.py").write_text(LOCK_ON_TWO_PROCESSES)
    (tmp_path / "run").mkdir()
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
              str(tmp_path / "lock_on_two_processes.py"), str(tmp_path / "run")]
    with output_dir_lock(tmp_path / "run"):
        refused = subprocess.run(launch, capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert refused.returncode != 0
    message = f"TwoTowerUserError: --output_dir {tmp_path / 'run'} is in use by another run (process {os.getpid()} on "
    assert refused.stderr.count(message) == 2, refused.stderr[-4000:]  # each rank raised it
    assert "locked" not in refused.stdout


def test_a_new_run_in_a_used_folder_is_refused(seed_runs, corpus, tmp_path):
    shutil.copytree(seed_runs[1]["model_dir"], tmp_path / "run" / "model")  # with seed 1's checkpoints
    shutil.copytree(Path(seed_runs[1]["model_dir"]).parent / "checkpoints", tmp_path / "run" / "checkpoints")
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, tmp_path / "run", seed=2))
    message = str(raised.value)
    assert f"--output_dir {tmp_path / 'run'} already holds a run (checkpoints/, model/)" in message
    assert "--resume_from_checkpoint latest" in message and "--overwrite_output_dir" in message
    assert bitwise_equal(weights(tmp_path / "run"), weights(Path(seed_runs[1]["model_dir"]).parent))


def test_overwrite_output_dir_clears_only_what_a_run_writes(seed_runs, corpus, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(Path(seed_runs[1]["model_dir"]).parent, run)
    (run / "runs" / "pretrain").mkdir(parents=True)
    (run / "runs" / "pretrain" / "events.out.tfevents.1.old").write_text("seed 1's logs")
    (run / ".model.tmp").mkdir()  # a final save that was interrupted
    (run / "notes.txt").write_text("the user's")
    (run / "data").mkdir()
    (run / "data" / "train.txt").write_text("the user's")
    result = training_function(small_config(corpus, run, seed=2, overwrite_output_dir=True))
    assert (run / "notes.txt").read_text() == (run / "data" / "train.txt").read_text() == "the user's"
    assert not (run / ".model.tmp").exists()
    # seed 1's logs are gone; runs/ holds the new run's evaluations alone
    assert [path.name for path in (run / "runs").rglob("*") if path.is_file()] == [EVAL_HISTORY]
    assert read_eval_history(run)[-1]["loss"] == pytest.approx(result["eval_metrics"]["loss"])
    # What is left is seed 2's run alone, as it is in a folder of its own.
    assert result["train_losses"] == seed_runs[2]["train_losses"]
    assert bitwise_equal(weights(run), weights(Path(seed_runs[2]["model_dir"]).parent))
    assert [path.name for path in list_checkpoints(run)] == ["step_2", "epoch_0", "step_6"]
    for checkpoint in list_checkpoints(run):
        assert yaml.safe_load((checkpoint / "training_config.yaml").read_text())["seed"] == 2


def test_resume_and_overwrite_together_are_refused(corpus, tmp_path):
    with pytest.raises(TwoTowerUserError, match="drop one of them"):
        training_function(small_config(corpus, tmp_path, resume_from_checkpoint="latest", overwrite_output_dir=True))


def test_an_output_dir_that_cannot_be_written_fails_before_any_work(corpus, tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(TwoTowerUserError, match=f"--output_dir {tmp_path / 'a-file' / 'run'} cannot be written"):
        training_function(small_config(corpus, tmp_path / "a-file" / "run"))

    def refused(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(run_folder.tempfile, "TemporaryFile", refused)
    with pytest.raises(TwoTowerUserError, match=r"cannot be written \(Permission denied\): choose a folder"):
        training_function(small_config(corpus, tmp_path / "read-only"))


@pytest.fixture(scope="module")
def disk_estimate(seed_runs) -> tuple[int, int]:
    """Bytes of a checkpoint and of the model of the small run, estimated from the parameters."""
    model = AutoModelForCausalLM.from_pretrained(seed_runs[1]["model_dir"])
    phase = make_phase(load_config("tiny"))
    trained = phase.trained_module(model, torch.device("cpu"))  # the probes are frozen
    return run_disk_bytes(model, trained, phase.optimizer_state_copies)


def test_the_disk_estimate_is_the_size_of_the_files_a_run_writes(seed_runs, disk_estimate):
    checkpoint_bytes, model_bytes = disk_estimate
    output_dir = Path(seed_runs[1]["model_dir"]).parent
    # The files of the tensors (their safetensors headers and pickle framing add under 2%)
    checkpoint = output_dir / "checkpoints" / "step_6"
    written = sum((checkpoint / name).stat().st_size for name in ("model.safetensors", "optimizer.bin"))
    assert checkpoint_bytes == pytest.approx(written, rel=0.02)
    assert model_bytes == pytest.approx((output_dir / "model" / "model.safetensors").stat().st_size, rel=0.02)


def test_a_run_that_does_not_fit_on_the_disk_is_refused_with_the_numbers(disk_estimate, corpus, tmp_path, monkeypatch):
    checkpoint_bytes, model_bytes = disk_estimate
    needed = 3 * checkpoint_bytes + model_bytes  # the run writes 3 checkpoints (steps 2, 4 and 6), all kept; the model
    monkeypatch.setattr(run_folder, "free_bytes", lambda folder: needed - 1)
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, tmp_path / "run"))
    message = str(raised.value)
    assert f"--output_dir {tmp_path / 'run'} has {readable_bytes(needed - 1)} free" in message
    assert f"about {readable_bytes(needed)}: 3 checkpoints of {readable_bytes(checkpoint_bytes)} (" in message
    assert "--checkpoints_total_limit 3" in message and not (tmp_path / "run" / "checkpoints").exists()
    monkeypatch.setattr(run_folder, "free_bytes", lambda folder: needed)  # exactly enough
    assert training_function(small_config(corpus, tmp_path / "run"))["completed_steps"] == 6


def test_the_disk_estimate_counts_only_the_checkpoints_a_run_writes(disk_estimate, corpus, tmp_path, monkeypatch):
    # 3 steps of a 4-step epoch without --checkpointing_steps: one checkpoint, at the last step, however many are kept
    checkpoint_bytes, model_bytes = disk_estimate
    config = without_step_checkpoints(small_config(corpus, tmp_path / "run", max_train_steps=3))
    needed = checkpoint_bytes + model_bytes
    monkeypatch.setattr(run_folder, "free_bytes", lambda folder: needed - 1)
    with pytest.raises(TwoTowerUserError, match=f"about {readable_bytes(needed)}: 1 checkpoint of "):
        training_function(config)
    monkeypatch.setattr(run_folder, "free_bytes", lambda folder: needed)
    assert training_function(config)["completed_steps"] == 3
    assert [path.name for path in list_checkpoints(tmp_path / "run")] == ["step_3"]


@pytest.mark.parametrize("first_step, last_step, checkpointing_steps, epoch_checkpoints, written", [
    (0, 6, 2, True, 3),  # steps 2, 4 (epoch_0) and 6, as the small run writes them
    (0, 12, 2, True, 6),  # an epoch's end on a multiple of 2 is one checkpoint (epoch_N), not two
    (0, 9, 3, True, 5),  # 3, 4 (epoch_0), 6, 8 (epoch_1), 9
    (0, 7, 2, True, 4),  # 2, 4, 6 and the last step
    (0, 3, None, True, 1),  # the last step only
    (4, 6, 2, True, 1),  # resumed at step 4: step 6
    (6, 6, 2, True, 0),  # resumed at the last step: only the model is saved
    (0, 50, None, False, 0),  # linear probes without --checkpointing_steps take none
    (0, 50, 20, False, 3),  # linear probes: 20, 40 and the last step
])
def test_the_checkpoints_of_a_run_are_counted_as_the_loop_takes_them(
    first_step, last_step, checkpointing_steps, epoch_checkpoints, written
):
    steps_per_epoch = 4
    assert run_folder.checkpoints_written(
        first_step, last_step, checkpointing_steps, steps_per_epoch, epoch_checkpoints
    ) == written


def test_a_full_disk_while_checkpointing_fails_in_one_line_and_removes_its_partial_folder(corpus, tmp_path,
                                                                                           monkeypatch):
    def save_state_on_a_full_disk(self, output_dir, **kwargs):
        (Path(output_dir) / "model.safetensors").write_bytes(b"the first bytes")
        raise NO_SPACE

    monkeypatch.setattr(Accelerator, "save_state", save_state_on_a_full_disk)
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, tmp_path / "run"))
    message = str(raised.value)
    assert message.startswith(f"No space left on device while writing {tmp_path / 'run' / 'checkpoints' / 'step_2'};")
    assert "\n" not in message
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []  # no partial .step_2.tmp
    monkeypatch.undo()
    # The lock was released and nothing of the failed run counts as an earlier run: the same command now runs.
    assert training_function(small_config(corpus, tmp_path / "run"))["completed_steps"] == 6


def test_a_full_disk_while_saving_the_model_keeps_the_checkpoints(seed_runs, corpus, tmp_path, monkeypatch):
    def save_pretrained_on_a_full_disk(self, folder, **kwargs):
        (Path(folder) / "config.json").write_text("{")
        raise NO_SPACE

    monkeypatch.setattr(modeling_twotower.TwoTowerForCausalLM, "save_pretrained", save_pretrained_on_a_full_disk)
    with pytest.raises(TwoTowerUserError, match=f"No space left on device while writing {tmp_path / 'run' / 'model'};"):
        training_function(small_config(corpus, tmp_path / "run", seed=1))
    assert not (tmp_path / "run" / "model").exists() and not (tmp_path / "run" / ".model.tmp").exists()
    monkeypatch.undo()
    # Resumed from step_6, the last step: nothing is left to train, only the model to save.
    resumed = training_function(small_config(corpus, tmp_path / "run", seed=1, resume_from_checkpoint="latest"))
    assert resumed["train_losses"] == [] and resumed["completed_steps"] == 6
    assert bitwise_equal(weights(tmp_path / "run"), weights(Path(seed_runs[1]["model_dir"]).parent))


def test_a_full_disk_while_writing_a_file_removes_its_temporary_copy(tmp_path):
    def write_on_a_full_disk(tmp):
        Path(tmp).write_text("the first bytes")
        raise NO_SPACE

    with pytest.raises(TwoTowerUserError, match=f"No space left on device while writing {tmp_path / 'report.json'};"):
        write_atomically(tmp_path / "report.json", write_on_a_full_disk)
    assert list(tmp_path.iterdir()) == []
    write_text_atomically(tmp_path / "report.json", "{}")
    assert [path.name for path in tmp_path.iterdir()] == ["report.json"]


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs: a disk that really fills, so that each writer raises its own error (mounting needs root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"needs a tmpfs to fill a real disk, which this user cannot mount: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "--lazy", str(disk)], check=True)  # lazy: a failed torch.save's traceback may hold a file


def fill(disk: Path, leave: int) -> Path:
    """Take all but `leave` bytes of `disk`, as another program writing to it would."""
    filler = disk / "filler"
    with open(filler, "ab") as handle:
        handle.write(bytes(max(shutil.disk_usage(disk).free - leave, 0)))
    return filler


MODEL_FILE_BYTES = 1_570_184  # the small run's model.safetensors (optimizer.bin: 2.6 MB)
FULL_AT = {
    "the weights (safetensors)": 64 * 1024,
    "the optimizer state (torch.save)": MODEL_FILE_BYTES + 256 * 1024,
}


@pytest.mark.parametrize("full_at", FULL_AT)
def test_a_disk_that_fills_while_checkpointing_fails_in_one_line(full_at, corpus, small_disk, monkeypatch):
    save_state = Accelerator.save_state

    def save_state_on_a_filling_disk(self, output_dir, **kwargs):
        fill(small_disk, leave=FULL_AT[full_at])
        return save_state(self, output_dir, **kwargs)

    monkeypatch.setattr(Accelerator, "save_state", save_state_on_a_filling_disk)
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, small_disk / "run"))
    message = str(raised.value)
    step_2 = small_disk / "run" / "checkpoints" / "step_2"
    assert message.startswith(f"No space left on device while writing {step_2}; its partial copy ")
    assert "\n" not in message
    assert list(step_2.parent.iterdir()) == []  # no partial .step_2.tmp


def test_a_disk_that_fills_at_the_final_save_keeps_the_run_resumable(corpus, small_disk, tmp_path, monkeypatch):
    # 3 steps of a 4-step epoch, no --checkpointing_steps: the run ends on a checkpoint all the same
    run, reference = small_disk / "run", tmp_path / "reference"
    expected = training_function(without_step_checkpoints(small_config(corpus, reference, seed=1, max_train_steps=3)))
    save_pretrained, fillers = modeling_twotower.TwoTowerForCausalLM.save_pretrained, []

    def save_pretrained_on_a_filling_disk(self, folder, **kwargs):
        fillers.append(fill(small_disk, leave=512 * 1024))  # room for config.json and the code files, not the weights
        return save_pretrained(self, folder, **kwargs)

    monkeypatch.setattr(modeling_twotower.TwoTowerForCausalLM, "save_pretrained", save_pretrained_on_a_filling_disk)
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(without_step_checkpoints(small_config(corpus, run, seed=1, max_train_steps=3)))
    message = str(raised.value)
    assert message.startswith(f"No space left on device while writing {run / 'model'}; its partial copy "
                              f"{run / '.model.tmp'} was removed. The model needs about 1.6 MB and the disk has ")
    assert (f"The run's state at step 3 is kept in {run / 'checkpoints' / 'step_3'}: free space, then run the same "
            f"command with --resume_from_checkpoint latest") in message
    assert "\n" not in message and not (run / "model").exists() and not (run / ".model.tmp").exists()
    monkeypatch.undo()
    fillers[0].unlink()  # the user frees the space
    resumed = training_function(without_step_checkpoints(
        small_config(corpus, run, seed=1, max_train_steps=3, resume_from_checkpoint="latest")
    ))
    assert resumed["train_losses"] == [] and resumed["completed_steps"] == 3  # nothing trained again
    assert bitwise_equal(weights(run), weights(Path(expected["model_dir"]).parent))


def test_a_disk_that_fills_while_writing_a_file_removes_its_temporary_copy(small_disk):
    fill(small_disk, leave=64 * 1024)
    with pytest.raises(TwoTowerUserError) as raised:
        write_atomically(small_disk / "weights.safetensors", lambda tmp: save_file({"w": torch.zeros(1 << 20)}, tmp))
    assert str(raised.value).startswith(f"No space left on device while writing {small_disk / 'weights.safetensors'};")
    assert isinstance(raised.value.__cause__, SafetensorError)  # safetensors' own error, not an OSError
    assert [path.name for path in small_disk.iterdir()] == ["filler"]


@pytest.mark.parametrize("umask, mode", [(0o027, 0o640), (0o022, 0o644)])
def test_saved_files_get_the_users_umask(umask, mode, corpus, tmp_path):
    previous = os.umask(umask)
    try:
        training_function(small_config(corpus, tmp_path / "run", max_train_steps=1))
    finally:
        os.umask(previous)
    saved = [path for folder in ("model", "checkpoints") for path in (tmp_path / "run" / folder).rglob("*")
             if path.is_file()]
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "config.json"} <= {path.name for path in saved}
    assert [path for path in saved if path.stat().st_mode & 0o777 != mode] == []


def test_a_folder_without_a_checkpoint_is_not_offered_resuming(corpus, tmp_path):
    run = tmp_path / "run"
    (run / "runs" / "pretrain").mkdir(parents=True)  # the logs of a run killed before its first checkpoint
    (run / "runs" / "pretrain" / "events.out.tfevents.1.host").write_bytes(b"\0")
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, run))
    message = str(raised.value)
    assert message.startswith(f"--output_dir {run} already holds a run (runs/) but no checkpoint to resume: start "
                              f"over with --overwrite_output_dir")
    assert "--resume_from_checkpoint" not in message
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, run, resume_from_checkpoint="latest"))
    assert str(raised.value) == (
        f"--resume_from_checkpoint latest: no checkpoint in {run / 'checkpoints'}, but {run} holds an earlier run "
        f"(runs/): start over with --overwrite_output_dir instead of --resume_from_checkpoint, or choose another "
        f"--output_dir."
    )
    assert training_function(small_config(corpus, run, max_train_steps=1, overwrite_output_dir=True))[
        "completed_steps"] == 1


def test_a_run_leaves_no_lock_file_behind(seed_runs, corpus, tmp_path):
    assert not list(Path(seed_runs[1]["model_dir"]).parent.glob(".run.lock*"))  # a run that ended
    (tmp_path / "run" / "model").mkdir(parents=True)
    (tmp_path / "run" / "model" / "config.json").write_text("{}")
    with pytest.raises(TwoTowerUserError, match="already holds a run"):  # a run that failed while holding the lock
        training_function(small_config(corpus, tmp_path / "run"))
    assert [path.name for path in (tmp_path / "run").iterdir()] == ["model"]
