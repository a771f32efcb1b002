"""One run per output folder: the lock, a reused folder, a folder that cannot be written or is too small, full disks."""

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
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import modeling_twotower
from test_training import corpus, tiny_config  # noqa: F401 (corpus is a fixture)
from twotower.training import folder_lock, run_folder
from twotower.training.arguments import load_config
from twotower.training.atomic import write_atomically, write_text_atomically
from twotower.training.checkpointing import list_checkpoints
from twotower.training.errors import TwoTowerUserError
from twotower.training.folder_lock import output_dir_lock
from twotower.training.phases import make_phase
from twotower.training.run_folder import EVAL_HISTORY, read_eval_history, readable_bytes, run_disk_bytes
from twotower.training.train import training_function

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def small_config(corpus: dict, output_dir: Path, **overrides):
    """4 steps per epoch (32 blocks of 8), 6 steps, checkpoints at steps 2, 4 (epoch_0) and 6."""
    options = dict(max_train_blocks=32, gradient_accumulation_steps=1, max_train_steps=6, checkpointing_steps=2,
                   report_to="none")
    return tiny_config("tiny", corpus, output_dir, **{**options, **overrides})


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
from twotower.training.folder_lock import output_dir_lock
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
        holder.wait(timeout=60)
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
from twotower.training.folder_lock import locked_output_dir
with locked_output_dir(Accelerator(cpu=True), sys.argv[1]):
    print("locked", flush=True)
"""


def test_every_process_of_a_run_fails_on_a_locked_folder(tmp_path):
    # training_function's first step, on 2 processes (gloo): only rank 0 tries the lock, rank 1 learns from it.
    (tmp_path / "lock_on_two_processes.py").write_text(LOCK_ON_TWO_PROCESSES)
    (tmp_path / "run").mkdir()
    launch = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
              str(tmp_path / "lock_on_two_processes.py"), str(tmp_path / "run")]
    with output_dir_lock(tmp_path / "run"):
        refused = subprocess.run(launch, capture_output=True, text=True, timeout=300)
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

    monkeypatch.setattr(folder_lock.tempfile, "TemporaryFile", refused)
    with pytest.raises(TwoTowerUserError, match=r"cannot be written \(Permission denied\): choose a folder"):
        training_function(small_config(corpus, tmp_path / "read-only"))


@pytest.fixture(scope="module")
def disk_estimate(seed_runs) -> tuple[int, int]:
    """Bytes of a checkpoint and of the model of the small run, estimated from the parameters."""
    model = AutoModelForCausalLM.from_pretrained(seed_runs[1]["model_dir"])
    phase = make_phase(load_config("tiny"))
    trained = phase.trained_module(model, torch.device("cpu"))  # the probes are frozen
    return run_disk_bytes(model, trained, phase.make_optimizer(trained))


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
    needed = (3 + 1) * checkpoint_bytes + model_bytes  # 3 kept, one being written, and the model
    monkeypatch.setattr(run_folder, "free_bytes", lambda folder: needed - 1)
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(small_config(corpus, tmp_path / "run"))
    message = str(raised.value)
    assert f"--output_dir {tmp_path / 'run'} has {readable_bytes(needed - 1)} free" in message
    assert f"about {readable_bytes(needed)}: 4 checkpoints of {readable_bytes(checkpoint_bytes)} (" in message
    assert "--checkpoints_total_limit" in message and not (tmp_path / "run" / "checkpoints").exists()
    monkeypatch.setattr(run_folder, "free_bytes", lambda folder: needed)  # exactly enough
    assert training_function(small_config(corpus, tmp_path / "run", max_train_steps=1))["completed_steps"] == 1


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
