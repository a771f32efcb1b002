"""
Round four of docs/RELIABILITY.md: a checkpoint of another tower kind, file names that read as globs, a recipe that
sets a key twice or is JSON, the study's kept tables, Hub targets checked before the work, the Space's messages,
whose a feature cache is, a report replaced in one step, and the conversion script. Each case gives one clear error
(on the command line, one `error:` line with exit status 2) before any long work, or works, and loses nothing.
"""

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from unittest import mock

import huggingface_hub
import numpy as np
import pandas as pd
import pytest
import torch
from huggingface_hub import HfApi

os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")  # before evaluate reads its config (the Space's metric)

from modeling_twotower import TwoTowerCheckpointError, TwoTowerConfig, TwoTowerForCausalLM  # noqa: E402
from test_probe_feature_cache import corpus, models, probe_config  # noqa: E402, F401 (the probe phase's fixtures)
from test_wrong_models_and_inputs import assert_one_error_line, command, text_file  # noqa: E402, F401
from transformers import AutoModelForCausalLM  # noqa: E402
from twotower.evaluation.publishing import publish, publish_metric  # noqa: E402
from twotower.evaluation.scoring import score, versioned_report  # noqa: E402
from twotower.evaluation.study import driver as study  # noqa: E402
from twotower.evaluation.study.kept_files import (  # noqa: E402
    check_kept_run, set_aside_damaged_table, set_aside_if_damaged,
)
from twotower.evaluation.study.parts_of_speech import type_tags_path  # noqa: E402
from twotower.training import train  # noqa: E402
from twotower.training.feature_cache import feature_cache_checks, probe_cache  # noqa: E402
from twotower.training.arguments import load_config  # noqa: E402
from twotower.training.checkpoints.checkpointing import data_fingerprint  # noqa: E402
from twotower.training.data.blocks import load_raw_datasets, resolve_text_files  # noqa: E402
from twotower.training.feature_cache.feature_cache_checks import ShardChanged, ShardWriter  # noqa: E402
from twotower.training.train import training_function  # noqa: E402
from twotower.training.utils.errors import TwoTowerUserError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
METRIC_DIR = ROOT / "evaluation" / "tower_preference"
VOCAB_SIZE = 96


# 1. a checkpoint is checked against its config by structure: a config relabelled to another tower kind


def relabelled_copy(model_dir: Path, folder: Path, **fields) -> Path:
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))
    return folder


@pytest.fixture(scope="module")
def ssm_model_dir(tmp_path_factory):
    """A tiny state-space causal model with trained-probe records, saved as training saves it."""
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, max_position_embeddings=16, tower_type="ssm",
                                        probe_training_steps=1)  # fmt: skip
    folder = tmp_path_factory.mktemp("ssm")
    TwoTowerForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def transformer_model_dir(tmp_path_factory):
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, max_position_embeddings=16,
                                        probe_training_steps=1)  # fmt: skip
    folder = tmp_path_factory.mktemp("transformer")
    TwoTowerForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("saved, relabelled, kept, extra", [
    ("ssm", "transformer", "`model.towers.layers`", "`model.towers.forward_blocks`"),
    ("transformer", "ssm", "`model.towers.forward_blocks`", "`model.towers.layers`"),
])  # fmt: skip
def test_a_checkpoint_relabelled_to_another_tower_kind_is_refused_by_every_load_path(
    saved, relabelled, kept, extra, ssm_model_dir, transformer_model_dir, text_file, tmp_path, command
):
    source = ssm_model_dir if saved == "ssm" else transformer_model_dir
    folder = relabelled_copy(source, tmp_path / "relabelled", tower_type=relabelled)
    parts = (
        f"The config of {folder} does not describe its weights: its `tower_type: {relabelled}` model (layout bert) "
        f"has {kept}",
        f"they hold {extra}",
        f'The weights are those of a `tower_type: {saved}` model (layout bert): set `"tower_type": "{saved}"` in '
        f"{folder / 'config.json'} again",
    )
    for load in (TwoTowerForCausalLM.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(TwoTowerCheckpointError) as raised:
            load(folder)
        assert all(part in str(raised.value) for part in parts), str(raised.value)
    status, stderr = command(score.main, ["--model_dir", folder, "--output_dir", tmp_path / "report",
                                          "--validation_file", text_file, "--block_size", 16])  # fmt: skip
    assert_one_error_line(status, stderr, *parts)
    probe_phase = ["--recipe", "tiny_probe", "--pretrained_model", folder, "--train_file", text_file,
                   "--validation_file", text_file, "--block_size", 16, "--output_dir", tmp_path / "probe"]
    assert_one_error_line(*command(train.main, probe_phase), *parts)
    assert not (tmp_path / "report").exists() and not (tmp_path / "probe").exists()  # refused before any work


def test_tower_heads_are_accepted_exactly_when_the_config_says_so(tmp_path):
    torch.manual_seed(0)
    with_heads = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, tower_heads=True))
    with_heads.save_pretrained(tmp_path / "heads")
    reloaded = TwoTowerForCausalLM.from_pretrained(tmp_path / "heads")
    assert all(torch.equal(tensor, reloaded.state_dict()[name]) for name, tensor in with_heads.state_dict().items())
    folder = relabelled_copy(tmp_path / "heads", tmp_path / "no-heads", tower_heads=False)
    unexpected = r"hold `tower_heads`, which its `tower_type: transformer` model \(layout bert\) has not"
    with pytest.raises(TwoTowerCheckpointError, match=unexpected + r".*set `\"tower_heads\": true`"):
        TwoTowerForCausalLM.from_pretrained(folder)
    TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE)).save_pretrained(tmp_path / "plain")
    folder = relabelled_copy(tmp_path / "plain", tmp_path / "heads-claimed", tower_heads=True)
    missing = r"model \(layout bert\) has `tower_heads`, which the weights in model.safetensors lack"
    with pytest.raises(TwoTowerCheckpointError, match=missing + r".*set `\"tower_heads\": false`"):
        TwoTowerForCausalLM.from_pretrained(folder)


def space_app(monkeypatch, model_dir: Path):
    """app.py as the Space runs it, serving the folders under `model_dir`."""
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    monkeypatch.setenv("TOWER_PREFERENCE_MODEL_DIR", str(model_dir))
    monkeypatch.syspath_prepend(str(METRIC_DIR))
    spec = importlib.util.spec_from_file_location("tower_preference_space_app_messages", METRIC_DIR / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    return app


# 1 and 7. the Space: a relabelled checkpoint named by its kind; no message names a path of the server


def test_the_spaces_messages_name_the_model_as_given_never_a_server_path(ssm_model_dir, tmp_path, monkeypatch):
    import gradio as gr

    models_dir = tmp_path / "served"
    relabelled_copy(ssm_model_dir, models_dir / "relabelled", tower_type="transformer")
    (models_dir / "not-a-model").mkdir()
    (models_dir / "not-a-model" / "notes.txt").write_text("a folder of the model directory, not a model")
    app = space_app(monkeypatch, models_dir)
    messages = {}
    for name in ("relabelled", "not-a-model"):
        with pytest.raises(gr.Error) as raised:
            app.score_text(name, "a short text", 2)
        messages[name] = raised.value.message
    assert "`tower_type: transformer` model (layout bert) has `model.towers.layers`" in messages["relabelled"]
    assert "set `&quot;tower_type&quot;: &quot;ssm&quot;` in relabelled/config.json" in messages["relabelled"]
    assert messages["not-a-model"].startswith("&#x27;not-a-model&#x27; is not a model folder or Hub model id")
    for message in messages.values():
        assert str(tmp_path) not in message and str(models_dir.resolve()) not in message, message


# 2 and 8. a path that exists is that path, though its name reads as a glob


def test_a_data_file_whose_name_reads_as_a_glob_is_that_file(tmp_path):
    bracketed = tmp_path / "a[1].txt"
    bracketed.write_text("the bracketed file\n")
    assert resolve_text_files(str(bracketed)) == [str(bracketed)]  # alone: no "No .txt files found"
    (tmp_path / "a1.txt").write_text("the file its name matches as a glob\n")
    starred = tmp_path / "b*.txt"
    starred.write_text("the starred file\n")
    (tmp_path / "bb.txt").write_text("another file the star matches\n")
    for path, text in ((bracketed, "the bracketed file\n"), (starred, "the starred file\n")):
        assert resolve_text_files(str(path)) == [str(path)]
        assert load_raw_datasets(None, train_file=str(path), validation_file=str(path))["train"]["text"] == [text]
    config = load_config("tiny", ["--train_file", str(bracketed), "--output_dir", str(tmp_path / "run")])
    assert list(data_fingerprint(config)) == [str(bracketed)]  # what a checkpoint records of the data
    # a glob still matches, where no file has its name
    assert resolve_text_files(str(tmp_path / "b?.txt")) == [str(starred), str(tmp_path / "bb.txt")]
    with pytest.raises(FileNotFoundError, match=r"No file matches the glob .*c\*.txt' \(and no file has that name\)"):
        resolve_text_files(str(tmp_path / "c*.txt"))


# 3 and 12. a recipe reads the same way in YAML or JSON, and a key set twice is refused


@pytest.mark.parametrize("name, text, message", [
    ("twice.yaml", "extends: tiny\nmax_train_steps: 3\nlearning_rate: 0.001\nmax_train_steps: 5\n",
     r"sets `max_train_steps` twice \(lines 2 and 4\) in one mapping; keep the one you mean"),
    ("twice.json", '{"extends": "tiny", "max_train_steps": 3, "max_train_steps": 5}',
     r"sets `max_train_steps` twice in one object; keep the one you mean"),
])  # fmt: skip
def test_a_recipe_that_sets_a_key_twice_is_refused_naming_it(name, text, message, tmp_path, command):
    recipe = tmp_path / name
    recipe.write_text(text)
    with pytest.raises(TwoTowerUserError, match=f"Recipe {recipe} {message}"):
        load_config(str(recipe))
    status, stderr = command(train.main, ["--recipe", recipe, "--output_dir", tmp_path / "run"])
    assert_one_error_line(status, stderr, f"Recipe {recipe} sets `max_train_steps` twice")
    assert not (tmp_path / "run").exists()


def test_a_study_recipe_that_sets_a_key_twice_at_any_depth_is_refused(tmp_path):
    from twotower.evaluation.study.config import load_study_config

    text = (ROOT / "evaluation" / "study" / "recipes" / "cpu.yaml").read_text()
    family = "  causal: {pretrain_recipe: tiny, probe_recipe: tiny_probe}\n"
    line = text[: text.index(family)].count("\n") + 1
    twice = text.replace(family, family.replace("}", ", pretrain_recipe: tiny_lstm}"))
    (tmp_path / "study.yaml").write_text(twice)  # a family's pretrain_recipe, twice
    with pytest.raises(TwoTowerUserError, match=f"sets `pretrain_recipe` twice \\(line {line}\\) in one mapping"):
        load_study_config(str(tmp_path / "study.yaml"))


def test_a_json_recipe_reads_as_its_yaml_twin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cfg.yaml").write_text("extends: tiny\nmax_train_steps: 3\nlearning_rate: 1e-3\n")
    (tmp_path / "cfg.json").write_text('{"extends": "tiny", "max_train_steps": 3, "learning_rate": 1e-3}')
    (tmp_path / "child.json").write_text('{"extends": "cfg.json", "seed": 7}')  # a JSON parent beside it
    from_yaml, from_json = load_config("cfg.yaml"), load_config("cfg.json")
    assert from_json.max_train_steps == from_yaml.max_train_steps == 3 and from_json.learning_rate == 0.001
    assert {**vars(from_json), "recipe": None} == {**vars(from_yaml), "recipe": None}
    assert load_config("child.json").seed == 7 and load_config("child.json").max_train_steps == 3


# 4. the feature cache knows whose it is


def test_a_shard_of_another_run_with_a_valid_manifest_is_refused_and_rebuilt(models, corpus, tmp_path, monkeypatch,
                                                                           capsys):
    another_model = tmp_path / "another"  # same sizes, other weights: its cache has the same shape
    shutil.copytree(models["causal"], another_model)
    torch.manual_seed(1)
    TwoTowerForCausalLM(TwoTowerConfig.from_pretrained(another_model)).save_pretrained(another_model)
    kept = {}
    real_close = ShardWriter.close

    def close_and_keep(self):  # the other run's first shard and its manifest, copied as it is built
        real_close(self)
        if "another" in str(self.path) and not kept:
            kept["shard"], kept["manifest"] = self.path.read_bytes(), self.manifest.read_bytes()

    monkeypatch.setattr(ShardWriter, "close", close_and_keep)
    training_function(probe_config(str(another_model), corpus, tmp_path / "another-run", probe_feature_cache="disk"))
    expected = training_function(probe_config(models["causal"], corpus, tmp_path / "clean", probe_feature_cache="disk"))
    swaps = []

    def close_then_swap(self):  # this run's first shard and manifest replaced by the other run's, which verify
        real_close(self)
        if not swaps:
            swaps.append(self.path)
            self.path.write_bytes(kept["shard"])
            self.manifest.write_bytes(kept["manifest"])

    monkeypatch.setattr(ShardWriter, "close", close_then_swap)
    capsys.readouterr()
    result = training_function(probe_config(models["causal"], corpus, tmp_path / "swapped", probe_feature_cache="disk"))
    shard = tmp_path / "swapped" / probe_cache.CACHE_DIR / "train_process0.bin"
    printed = capsys.readouterr().out
    assert swaps == [shard]
    assert f"The probe feature cache {shard} does not verify: it is another run's cache: manifest_process0.json " \
           "names the run" in printed and "Building the train cache again." in printed
    assert result["train_losses"] == expected["train_losses"] and result["eval_metrics"] == expected["eval_metrics"]


def test_a_shard_rewritten_in_place_with_its_time_set_back_stops_the_run(models, corpus, tmp_path, monkeypatch):
    reads = []
    real_batch = probe_cache.FeatureCache.replica_batch

    def replica_batch(self, positions):  # before the second read: other bytes, same size, inode and time
        reads.append(1)
        if len(reads) == 2:
            before = os.stat(self.shard.path)
            with open(self.shard.path, "r+b") as handle:
                handle.write(np.random.default_rng(0).bytes(before.st_size))
            os.utime(self.shard.path, ns=(before.st_atime_ns, before.st_mtime_ns))
            assert feature_cache_checks.ShardWatch.identity(self.shard.path) == self.shard.stat
        return real_batch(self, positions)

    monkeypatch.setattr(probe_cache.FeatureCache, "replica_batch", replica_batch)
    with pytest.raises(ShardChanged) as raised:
        training_function(probe_config(models["causal"], corpus, tmp_path, probe_feature_cache="disk"))
    shard = tmp_path / probe_cache.CACHE_DIR / "train_process0.bin"
    assert str(raised.value).startswith(f"The probe feature cache {shard} changed while this run read it: ")
    assert "rows just read differ from those this run wrote (its size, time and inode unchanged)" in str(raised.value)
    assert not list(tmp_path.glob(".run.lock*"))


# 5. a report replaced in one step, whatever instant a kill comes at


def report_files(folder: Path) -> dict:
    """What a reader sees: every file at the top of the folder (through the links), by name; not the hidden ones (a
    run killed with -9 leaves its unlocked lock files)."""
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file() and path.name[0] != "."}


def staged_report(folder: Path, files: dict) -> Path:
    staging = versioned_report.staging_folder(folder)
    for name, data in files.items():
        (staging / name).write_bytes(data)
    return staging


def killed_replacement(folder: Path, files: dict, kill_at: int) -> bool:
    """Replace the report of `folder` by `files` in a child process killed (SIGKILL) at its `kill_at`-th rename or
    link; True when it was killed (False: it finished first)."""
    child = os.fork()
    if child == 0:  # the child: count the steps, and die at the chosen one
        try:
            replace_counting_steps(folder, files, kill_at)
        finally:
            os._exit(0)
    _, status = os.waitpid(child, 0)
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def replace_counting_steps(folder: Path, files: dict, kill_at: int) -> None:
    """versioned_report.replace_report, the process killing itself (SIGKILL) at its `kill_at`-th rename or link."""
    steps = [0]

    def step(real):
        def counted(*args, **kwargs):
            steps[0] += 1
            if steps[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)

        return counted

    staging = staged_report(folder, files)
    for name in ("replace", "rename", "symlink", "link"):  # the child's own os module: it dies or exits after
        setattr(os, name, step(getattr(os, name)))
    versioned_report.replace_report(folder, staging)


@pytest.mark.parametrize("old_report", ["versioned", "plain files"])
def test_a_report_killed_at_any_step_of_its_replacement_leaves_the_old_one_whole(old_report, tmp_path):
    old = {"preference.json": b'{"old": 1}', "report.md": b"old report", "tokens.html": b"old view"}
    new = {"preference.json": b'{"new": 2}', "report.md": b"new report", "type_sums.parquet": b"new sums"}
    kill_at = 1
    while True:
        folder = tmp_path / f"kill-{kill_at}"
        folder.mkdir()
        (folder / "notes.txt").write_bytes(b"the user's")
        if old_report == "versioned":
            versioned_report.replace_report(folder, staged_report(folder, old))
        else:  # as reports were written before versions
            for name, data in old.items():
                (folder / name).write_bytes(data)
        killed = killed_replacement(folder, new, kill_at)
        seen = report_files(folder)
        assert seen in ({**old, "notes.txt": b"the user's"}, {**new, "notes.txt": b"the user's"}), (kill_at, seen)
        # the next report written removes what the killed one left, and is whole
        versioned_report.replace_report(folder, staged_report(folder, new))
        assert report_files(folder) == {**new, "notes.txt": b"the user's"}
        assert sorted(path.name for path in folder.glob(".report*")) == [".report", os.readlink(folder / ".report")]
        if not killed:
            break
        kill_at += 1
    assert kill_at > 4  # the steps were each killed in turn: the links, the one step, the leftovers' removal


def test_a_scoring_run_killed_while_its_report_replaces_the_old_one_leaves_the_old_one(text_file, tmp_path):
    from twotower.training.data.tokenizer import train_bpe_tokenizer

    model_dir = tmp_path / "model"  # as round three's report tests score: a BPE of 320 tokens trained on the text
    tokenizer = train_bpe_tokenizer(iter([text_file.read_text(encoding="utf-8").splitlines()]), 320)
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=320, max_position_embeddings=16, probe_training_steps=1)
    TwoTowerForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    report_dir = tmp_path / "report"
    options = ["--model_dir", model_dir, "--output_dir", report_dir, "--validation_file", text_file,
               "--block_size", 16, "--cpu", "true"]  # fmt: skip
    score.main([str(option) for option in options])
    old = report_files(report_dir)
    # a second scoring, killed with SIGKILL at the one step that makes its report visible
    kill = ("import os, signal, sys; from twotower.evaluation.scoring import score, versioned_report; "
            "real = versioned_report._point; "
            "versioned_report._point = lambda link, target: (os.kill(os.getpid(), signal.SIGKILL) "
            "if link.name == versioned_report.CURRENT else real(link, target)); "
            "score.main(sys.argv[1:])")  # fmt: skip
    killed = subprocess.run([sys.executable, "-c", kill, *map(str, options), "--max_blocks", "2"],
                            capture_output=True, text=True, timeout=600)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert report_files(report_dir) == old  # the old report, whole
    assert list(report_dir.glob(".report.*.tmp")) or len(list(report_dir.glob(".report.*"))) == 2  # its leftover
    score.main([str(option) for option in options])  # the next run removes it
    assert [path.name for path in report_dir.glob(".report.*")] == [os.readlink(report_dir / ".report")]


# 6 and 10. the conversion script: its output inside its input, damaged weights, a folder that cannot be written


def conversion(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def test_the_conversion_refuses_what_it_cannot_write_or_read_naming_it(tmp_path):
    old_dir = tmp_path / "old"
    shutil.copytree(ROOT / "tests" / "fixtures" / "causal", old_dir)
    before = {path.name: path.read_bytes() for path in old_dir.iterdir()}
    inside = conversion(old_dir, old_dir / "converted")
    assert inside.returncode != 0 and inside.stderr.startswith(f"error: {old_dir / 'converted'} is inside the input "
                                                               f"folder {old_dir}")  # fmt: skip
    assert {path.name: path.read_bytes() for path in old_dir.iterdir()} == before  # no stray copy in the input

    damaged = tmp_path / "damaged"
    shutil.copytree(old_dir, damaged)
    (damaged / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))
    refused = conversion(damaged, tmp_path / "from-damaged")
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith(f"error: {damaged / 'model.safetensors'} is not a readable safetensors file")
    assert not (tmp_path / "from-damaged").exists() and not list(tmp_path.glob(".from-damaged.*"))

    (tmp_path / "a-file").write_text("not a folder")
    refused = conversion(old_dir, tmp_path / "a-file" / "converted")
    assert refused.returncode != 0 and refused.stderr.startswith(f"error: {tmp_path / 'a-file' / 'converted'} cannot "
                                                                 "be written")  # fmt: skip


def test_the_conversion_refuses_a_read_only_folder_before_writing(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("convert_checkpoint", ROOT / "scripts" / "convert_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def read_only(*args, **kwargs):  # a read-only mount (the tests run as root, whom no permission stops)
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(module.tempfile, "TemporaryFile", read_only)
    with pytest.raises(module.ConversionError, match=r"cannot be written: .* is not a folder one can write to "
                                                     r"\(Read-only file system\)"):  # fmt: skip
        module.convert_folder(ROOT / "tests" / "fixtures" / "causal", tmp_path / "mount" / "converted")
    assert not (tmp_path / "mount").exists()


# 9. the study's kept tables, values included: tags, type sums and the index


def kept_tags(report_dir: Path, tokenizer_file: Path) -> Path:
    path = type_tags_path(report_dir, "text", tokenizer_file)
    path.parent.mkdir(parents=True)
    pd.DataFrame({"token_id": [1, 2], "count": [3, 4], "tag": ["DET", "NOUN"], "agreement": [1.0, 0.9],
                  "tagged": [True, True]}).to_parquet(path, index=False)  # fmt: skip
    return path


@pytest.mark.parametrize("damage, problem", [
    (lambda path: path.write_bytes(path.read_bytes()[:100]), "cannot be read"),
    (lambda path: pd.DataFrame({"token_id": [1]}).to_parquet(path), "lacks the column(s) ['count', 'tag'"),
    (lambda path: pd.DataFrame({"token_id": [1, 2], "count": [3, 4], "tag": ["DET", "NOUN"],
                                "agreement": [np.nan, 0.9], "tagged": [True, True]}).to_parquet(path),
     "holds NaN or infinite values in ['agreement']"),
])  # fmt: skip
def test_a_damaged_kept_tags_table_is_named_and_set_aside(damage, problem, tmp_path, capsys):
    import gzip

    tokenizer_file = tmp_path / "tokenizer.json.gz"
    tokenizer_file.write_bytes(gzip.compress(b'{"a tokenizer": 1}'))
    path = kept_tags(tmp_path / "report", tokenizer_file)
    redo = "the text is tagged again (where spaCy is installed)."  # as the study reads a text's kept tags
    assert not set_aside_damaged_table(path, "type_tags", redo)  # a sound table stays
    damage(path)
    damaged = path.read_bytes()
    assert set_aside_damaged_table(path, "type_tags", redo)
    printed = capsys.readouterr().out
    assert f"The kept type_tags table is damaged ({path} {problem}" in printed and "tagged again" in printed
    assert not path.exists() and path.with_name(f".{path.name}.damaged").read_bytes() == damaged  # nothing lost


def test_kept_type_sums_with_nan_are_named_and_their_run_set_aside(tmp_path, capsys):
    kept = tmp_path / "runs" / "a-t2-s0"
    (kept / "scores" / "text").mkdir(parents=True)
    (kept / "run.json").write_text(json.dumps({"run": {"name": "a-t2-s0"}, "probe": {}}))
    sums = pd.DataFrame({"half": np.int8([0, 1]), "token_id": [1, 1], "count": [2, 3],
                         "logprob_sum_probe0": [-1.0, np.nan], "logprob_sum_probe1": [-2.0, -2.5]})  # fmt: skip
    sums.to_parquet(kept / "scores" / "text" / "type_sums.parquet", index=False)
    path = kept / "scores" / "text" / "type_sums.parquet"
    with pytest.raises(TwoTowerUserError) as raised:
        check_kept_run(kept)
    assert str(raised.value).startswith(f"The kept results of run a-t2-s0 are damaged: {path} holds NaN or infinite "
                                        "values in ['logprob_sum_probe0']")  # fmt: skip
    assert set_aside_if_damaged(kept, "[1/1]") and (tmp_path / "runs" / ".a-t2-s0.damaged").is_dir()
    (tmp_path / "runs" / "a-t2-s1").mkdir()
    (tmp_path / "runs" / "a-t2-s1" / "run.json").write_text('{"run": {}, "probe": {}, "value": NaN}')
    with pytest.raises(TwoTowerUserError, match=r"run.json cannot be read \(NaN is not a number the study writes"):
        check_kept_run(tmp_path / "runs" / "a-t2-s1")


def test_the_recomputation_names_a_damaged_kept_table(tmp_path):
    report_dir = tmp_path / "causes"
    shutil.copytree(ROOT / "docs" / "study" / "causes", report_dir)
    index = pd.read_parquet(report_dir / "run_index.parquet")
    tags = report_dir / index["type_tags_path"][0]
    tags.write_bytes(tags.read_bytes()[:200])
    script = [sys.executable, str(ROOT / "scripts" / "recompute_study.py"), str(report_dir)]
    refused = subprocess.run(script, capture_output=True, text=True, timeout=600)
    assert refused.returncode == 1 and refused.stderr.startswith(f"error: {tags} cannot be read")
    index.drop(columns=["min_count"]).to_parquet(report_dir / "run_index.parquet", index=False)
    refused = subprocess.run(script, capture_output=True, text=True, timeout=600)
    assert refused.stderr.startswith(f"error: {report_dir / 'run_index.parquet'} lacks the column(s) ['min_count']")


# 11 and 13. every Hub target checked before any work: the repository id, the token, the offline mode


def test_an_upload_while_offline_is_refused_before_any_work(corpus, tmp_path, monkeypatch, command):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    config = load_config("tiny", ["--train_file", corpus["train_file"], "--output_dir", str(tmp_path / "run"),
                                  "--push_to_hub", "true", "--hub_model_id", "someone/tiny"])  # fmt: skip
    with mock.patch.object(HfApi, "whoami") as whoami, \
            pytest.raises(TwoTowerUserError, match=r"--push_to_hub --hub_model_id uploads to the Hub, but "
                                                   r"HF_HUB_OFFLINE is set.*or drop --push_to_hub"):  # fmt: skip
        training_function(config)
    assert not whoami.called and not (tmp_path / "run").exists()  # nothing trained, the token never sent
    staged = []
    monkeypatch.setattr(publish, "stage_model_repo", lambda *args, **kwargs: staged.append(args))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model folder: what the Hub is asked is refused first
    status, stderr = command(publish.main, ["--model_dir", tmp_path / "model", "--repo_id", "someone/tiny",
                                            "--output_dir", tmp_path / "hub"])  # fmt: skip
    assert_one_error_line(status, stderr, "--repo_id uploads to the Hub, but HF_HUB_OFFLINE is set",
                          "pass --dry-run to stage it without uploading")
    status, stderr = command(publish_metric.main, ["--repo_id", "someone/tower_preference"])
    assert_one_error_line(status, stderr, "--repo_id uploads to the Hub, but HF_HUB_OFFLINE is set")
    assert not staged


class StudyStarted(Exception):
    """Raised by a stand-in for the study's runs: the checks before them passed."""


def study_started(*args):
    raise StudyStarted


@pytest.mark.parametrize("repo_id, online, message", [
    ("a/b/c", False, "--push_to_hub is 'a/b/c'; pass `user/name`"),
    ("a--b/c", False, "--push_to_hub is 'a--b/c'; pass `user/name`"),
    ("someone/study", False, "--push_to_hub uploads to the Hub, but HF_HUB_OFFLINE is set"),
    ("someone/study", True, "Could not reach the Hub to check the Hugging Face token"),
])  # fmt: skip
def test_the_studys_hub_target_is_checked_before_any_run(repo_id, online, message, tmp_path, monkeypatch, command):
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", not online)
    monkeypatch.setattr(study, "run_study", lambda *args: pytest.fail("the study started"))
    with mock.patch.object(HfApi, "whoami", side_effect=ConnectionError("Name or service not known")):
        status, stderr = command(study.main, ["--data_dir", tmp_path, "--output_dir", tmp_path / "out",
                                              "--push_to_hub", repo_id])  # fmt: skip
    assert_one_error_line(status, stderr, message)
    if not online:  # a dry run uploads nothing: only the repository id is checked, before the study starts
        monkeypatch.setattr(study, "run_study", study_started)
        arguments = ["--data_dir", tmp_path, "--output_dir", tmp_path / "out", "--push_to_hub", repo_id, "--dry-run"]
        if repo_id == "someone/study":
            with pytest.raises(StudyStarted):
                study.main([str(argument) for argument in arguments])
        else:
            assert_one_error_line(*command(study.main, arguments), message)
