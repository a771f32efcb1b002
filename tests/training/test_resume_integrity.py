"""Resuming: only from a checkpoint whose every file verifies, taken with the same options; a finished run is left."""

import dataclasses
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from test_training import corpus, tiny_config  # noqa: F401 (corpus is a fixture)
from twotower.training.checkpoints.checkpointing import list_checkpoints, read_progress
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.checkpoints.manifest import MANIFEST_NAME, write_manifest
from twotower.training.train import training_function


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory) -> dict:
    # 32 blocks / 8 = 4 steps per epoch; 6 steps with dropout on: checkpoints step_2, epoch_0 (step 4) and step_6
    config = tiny_config(
        "tiny", corpus, tmp_path_factory.mktemp("finished"), max_train_blocks=32, gradient_accumulation_steps=1,
        max_train_steps=6, checkpointing_steps=2, report_to="none",
    )
    return {"config": config, **training_function(config)}


def copy_of(run: dict, folder: Path, **overrides):
    """The run's config, pointed at a copy of its output folder (which a test may damage)."""
    shutil.copytree(run["config"].output_dir, folder)
    return dataclasses.replace(run["config"], output_dir=str(folder), **overrides)


def final_weights(output_dir) -> dict:
    return load_file(Path(output_dir) / "model" / "model.safetensors")


def assert_bitwise_equal(weights: dict, expected: dict):
    assert weights.keys() == expected.keys()
    assert all(torch.equal(tensor, expected[name]) for name, tensor in weights.items())


def test_every_checkpoint_file_is_in_its_manifest(finished_run):
    checkpoints = list_checkpoints(finished_run["config"].output_dir)
    assert [path.name for path in checkpoints] == ["step_2", "epoch_0", "step_6"]
    for checkpoint in checkpoints:
        # Recomputed here: the sha256 of every file but the manifest, in sha256sum's format.
        files = sorted(path for path in checkpoint.rglob("*") if path.is_file() and path.name != MANIFEST_NAME)
        expected = "".join(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.relative_to(checkpoint)}\n"
                           for path in files)
        assert (checkpoint / MANIFEST_NAME).read_text() == expected
        names = {path.name for path in files}
        assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "progress.json",
                "training_config.yaml", "tokenizer.json"} <= names
        assert subprocess.run(["sha256sum", "--check", "--quiet", MANIFEST_NAME], cwd=checkpoint).returncode == 0


def truncate(path: Path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# Damage to the newest checkpoint (step_6): (file, how)
DAMAGES = {
    "truncated RNG states": ("random_states_0.pkl", truncate),
    "truncated optimizer state": ("optimizer.bin", truncate),
    "empty weights": ("model.safetensors", lambda path: path.write_bytes(b"")),
    "corrupt progress.json": ("progress.json", lambda path: path.write_text('{"completed_steps": ')),
    "edited config": ("training_config.yaml", lambda path: path.write_text(path.read_text() + "seed: 1\n")),
    "missing manifest": (MANIFEST_NAME, Path.unlink),
    "corrupt manifest": (MANIFEST_NAME, lambda path: path.write_text("not a checksum line\n")),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_checkpoint_names_the_file_and_the_previous_checkpoint(damage, finished_run, tmp_path):
    name, damage_file = DAMAGES[damage]
    run = tmp_path / "run"
    config = copy_of(finished_run, run, resume_from_checkpoint=str(run / "checkpoints" / "step_6"))
    damage_file(run / "checkpoints" / "step_6" / name)
    (run / "model").rename(run / "model-kept")  # resuming is then not a no-op
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(config)
    message = str(raised.value)
    assert str(run / "checkpoints" / "step_6" / name) in message
    assert f"--resume_from_checkpoint {run / 'checkpoints' / 'epoch_0'}" in message
    assert "\n" not in message
    assert not (run / "model").exists()  # nothing was trained


@pytest.mark.parametrize("damage", ["truncated RNG states", "corrupt progress.json", "missing manifest"])
def test_latest_skips_a_damaged_checkpoint_and_resumes_bitwise(damage, finished_run, tmp_path, caplog):
    name, damage_file = DAMAGES[damage]
    run = tmp_path / "run"
    config = copy_of(finished_run, run, resume_from_checkpoint="latest")
    damage_file(run / "checkpoints" / "step_6" / name)
    resumed = training_function(config)
    assert str(run / "checkpoints" / "step_6" / name) in caplog.text  # the warning names the file
    # It resumed from the newest checkpoint that verifies, epoch_0 (step 4), and ended as the run that never stopped.
    assert resumed["train_losses"] == finished_run["train_losses"][4:]
    assert_bitwise_equal(final_weights(run), final_weights(finished_run["config"].output_dir))


def test_options_that_change_the_result_are_refused_with_both_values(finished_run, tmp_path):
    config = copy_of(finished_run, tmp_path / "run", resume_from_checkpoint="latest")
    changed = dataclasses.replace(config, seed=7, learning_rate=1e-3, max_train_blocks=24, hidden_dropout=0.0)
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(changed)
    message = str(raised.value)
    for difference in ("seed: 42 -> 7", "learning_rate: 0.003 -> 0.001", "max_train_blocks: 32 -> 24",
                       "hidden_dropout: None -> 0.0"):
        assert difference in message
    assert "output_dir" not in message and "resume_from_checkpoint:" not in message  # options free to differ
    assert "--allow_config_change" in message and str(tmp_path / "run" / "checkpoints" / "step_6") in message


def test_another_number_of_processes_is_refused(finished_run, tmp_path):
    run = tmp_path / "run"
    checkpoint = run / "checkpoints" / "epoch_0"
    config = copy_of(finished_run, run, resume_from_checkpoint=str(checkpoint))
    shutil.copy(checkpoint / "random_states_0.pkl", checkpoint / "random_states_1.pkl")  # as 2 processes save it
    write_manifest(checkpoint)
    with pytest.raises(TwoTowerUserError, match="num_processes: 2 -> 1"):  # the global batch would halve
        training_function(config)


def test_allow_config_change_resumes_with_the_new_options(finished_run, tmp_path, caplog):
    epoch_0 = tmp_path / "run" / "checkpoints" / "epoch_0"
    config = copy_of(finished_run, tmp_path / "run", resume_from_checkpoint=str(epoch_0), seed=7,
                     allow_config_change=True)
    resumed = training_function(config)
    assert "seed: 42 -> 7" in caplog.text
    assert resumed["completed_steps"] == 6 and len(resumed["train_losses"]) == 2
    assert resumed["train_losses"] != finished_run["train_losses"][4:]  # another seed: other dropout masks


def test_options_that_leave_the_result_unchanged_may_differ(finished_run, tmp_path):
    run = tmp_path / "run"
    config = copy_of(
        finished_run, run, resume_from_checkpoint=str(run / "checkpoints" / "epoch_0"), logging_steps=3,
        report_to="tensorboard", checkpointing_steps=1, checkpoints_total_limit=5, peak_tflops=2.0, disable_tqdm=False,
        recipe=None,
    )
    resumed = training_function(config)
    assert resumed["train_losses"] == finished_run["train_losses"][4:]
    assert_bitwise_equal(final_weights(run), final_weights(finished_run["config"].output_dir))
    assert read_progress(run / "checkpoints" / "step_5")["completed_steps"] == 5


def test_resuming_a_finished_run_does_nothing(finished_run, tmp_path, capsys):
    run = tmp_path / "run"
    config = copy_of(finished_run, run, resume_from_checkpoint="latest")
    model_file = run / "model" / "model.safetensors"
    before = (model_file.stat().st_mtime_ns, sorted(path.name for path in (run / "checkpoints").iterdir()))
    result = training_function(config)
    assert result["completed_steps"] == 6 and result["train_losses"] == []
    assert "Nothing to do: the run has finished" in capsys.readouterr().out
    assert (model_file.stat().st_mtime_ns, sorted(path.name for path in (run / "checkpoints").iterdir())) == before


class RunsAShellCommand:
    """Unpickled, it would run `command`: what a crafted random-state file could hold."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


# Replacements of step_6's random_states_0.pkl whose checksum is then recomputed, so that the manifest verifies
RNG_STATE_REPLACEMENTS = {
    "truncated": lambda path, marker: truncate(path),
    "crafted pickle": lambda path, marker: torch.save({"random_state": RunsAShellCommand(f"touch {marker}")}, path),
    "other tensors": lambda path, marker: torch.save({"weights": torch.zeros(3)}, path),
}


@pytest.mark.parametrize("replacement", RNG_STATE_REPLACEMENTS)
def test_random_states_that_do_not_load_are_refused_though_their_checksum_verifies(
    replacement, finished_run, tmp_path, caplog
):
    run, marker = tmp_path / "run", tmp_path / "the-payload-ran"
    step_6 = run / "checkpoints" / "step_6"
    config = copy_of(finished_run, run, resume_from_checkpoint=str(step_6))
    RNG_STATE_REPLACEMENTS[replacement](step_6 / "random_states_0.pkl", marker)
    write_manifest(step_6)
    (run / "model").rename(run / "model-kept")  # resuming is then not a no-op
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(config)
    message = str(raised.value)
    assert message.startswith(f"Cannot resume from {step_6}: {step_6 / 'random_states_0.pkl'} does not hold ")
    assert message.endswith(f"--resume_from_checkpoint {run / 'checkpoints' / 'epoch_0'}.") and "\n" not in message
    # `latest` warns, naming the file, and ends as the run that never stopped from the previous checkpoint
    resumed = training_function(dataclasses.replace(config, resume_from_checkpoint="latest"))
    assert str(step_6 / "random_states_0.pkl") in caplog.text
    assert resumed["train_losses"] == finished_run["train_losses"][4:]
    assert_bitwise_equal(final_weights(run), final_weights(finished_run["config"].output_dir))
    assert not marker.exists()


def test_resuming_on_edited_training_text_is_refused_naming_the_file(corpus, tmp_path, caplog, capsys):
    data = tmp_path / "data"
    data.mkdir()
    for split in ("train_file", "validation_file"):
        shutil.copy(corpus[split], data)
    train_file = data / Path(corpus["train_file"]).name
    config = tiny_config(
        "tiny", {"train_file": str(train_file), "validation_file": str(data / Path(corpus["validation_file"]).name)},
        tmp_path / "run", max_train_blocks=32, gradient_accumulation_steps=1, max_train_steps=6,
        checkpointing_steps=2, report_to="none",
    )
    training_function(config)
    assert "sha256" not in "".join(capsys.readouterr())  # hashing the data prints nothing on small data
    epoch_0 = tmp_path / "run" / "checkpoints" / "epoch_0"
    text = train_file.read_text(encoding="utf-8")
    train_file.write_text(text.replace(" the ", " thy ", 1), encoding="utf-8")  # one word fixed: the same size
    resumed_config = dataclasses.replace(config, resume_from_checkpoint=str(epoch_0))
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(resumed_config)
    message = str(raised.value)
    assert message.startswith(f"{epoch_0} was taken on other data: {train_file} changed (")
    assert "--allow_config_change" in message and "\n" not in message
    resumed = training_function(dataclasses.replace(resumed_config, allow_config_change=True))
    assert f"{train_file} changed" in caplog.text and resumed["completed_steps"] == 6
