"""Sharing on the Hub: the staged model repository, its card, loading it from a Hub cache, and the metric Space.

One tiny model is trained (pretrain, then probes) and scored once per session; the network calls of huggingface_hub
are mocked, so these tests run offline.
"""

import errno
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from html import unescape
from pathlib import Path
from types import SimpleNamespace
from unittest import mock
from urllib.parse import unquote, urlsplit

import evaluate
import markdown
import numpy as np
import pandas as pd
import pytest
import torch
import yaml
import huggingface_hub
from huggingface_hub import HfApi, ModelCard, ModelCardData
from huggingface_hub.repocard_data import model_index_to_eval_results
from huggingface_hub.utils import filter_repo_objects
from safetensors.torch import load_file, save_file

from conftest import HANG_LIMIT_S
from modeling_twotower import TwoTowerForCausalLM
from twotower.evaluation.publishing.publish_metric import METRIC_DIR, MODEL_CODE_DIR, SPACE_FILES, stage_metric_space
from twotower.evaluation.publishing.publish_metric import main as publish_metric_main
from twotower.evaluation.scoring.report_files import PLOTS, REPLICA_PLOTS
from twotower.evaluation.scoring.score import score_model
from twotower.evaluation.tower_preference.replica_preference import compute_preference
from twotower.training.arguments import TwoTowerTrainingConfig, load_config
from twotower.evaluation.publishing.model_card import PLOT_CAPTIONS, TOP_TOKENS_IN_CARD, render_model_card
from twotower.evaluation.publishing.model_folder import portable, short_path
from twotower.training.utils.errors import TwoTowerUserError
from twotower.evaluation.publishing.publish import main as publish_main
from twotower.evaluation.publishing.publish import stage_model_repo
from twotower.training.train import training_function
from transformers import AutoTokenizer

REPO_ID = "tower-lab/twotower-test"
FAKE_TOKEN = "hf_fakeTokenThatMustNeverBePrinted123"
PROMPT = "The tower was built in"
# Tiny but real: 2 towers x (2 layers, width 32) on the first 60 kB of WikiText-2 with a 400-token BPE.
TRAINING = dict(
    block_size=32, per_device_train_batch_size=8, per_device_eval_batch_size=16, hidden_size=32,
    num_attention_heads=2, intermediate_size=64, cpu=True, report_to="none", disable_tqdm=True,
    peak_tflops=1.0, logging_steps=10,
)  # fmt: skip


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, shared_data):
    """(probe model folder, report folder) of a tiny model trained and scored in this session."""
    root = tmp_path_factory.mktemp("publish")
    source = shared_data / "wikitext-2"
    (root / "wikitext-2").mkdir()
    train_file, validation_file = root / "wikitext-2" / "train.txt", root / "wikitext-2" / "valid.txt"
    train_file.write_text((source / "train.txt").read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    validation_file.write_text((source / "valid.txt").read_text(encoding="utf-8")[:15_000], encoding="utf-8")
    data = dict(train_file=str(train_file), validation_file=str(validation_file))

    # Matrices this small gain nothing from threads, and on a busy 2-core machine threads make training ~10x slower.
    num_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train_and_score(root, data)
    finally:
        torch.set_num_threads(num_threads)


def _train_and_score(root: Path, data: dict) -> tuple[Path, Path]:
    pretrain = training_function(
        TwoTowerTrainingConfig(
            phase="pretrain", output_dir=str(root / "pretrain"), tokenizer_vocab_size=400, max_train_steps=20,
            num_warmup_steps=2, **data, **TRAINING,
        )
    )  # fmt: skip
    probe = training_function(
        TwoTowerTrainingConfig(
            phase="probe", pretrained_model=pretrain["model_dir"], output_dir=str(root / "probe"),
            max_train_steps=10, **data, **TRAINING,
        )
    )  # fmt: skip
    report_dir = root / "report"
    score_model(probe["model_dir"], report_dir, block_size=32, min_count=3, disable_tqdm=True, cpu=True, **data)
    return Path(probe["model_dir"]), report_dir


@pytest.fixture(scope="session")
def staged_repo(trained_run, tmp_path_factory):
    model_dir, report_dir = trained_run
    output_dir = tmp_path_factory.mktemp("staged") / "twotower-test"
    return stage_model_repo(model_dir, output_dir, REPO_ID, report_dir, hardware="2 CPU cores")


def test_staged_repo_holds_the_model_code_tokenizer_configs_and_report(trained_run, staged_repo):
    model_dir, report_dir = trained_run
    files = {path.relative_to(staged_repo).as_posix() for path in staged_repo.rglob("*") if path.is_file()}
    expected = {
        "README.md", "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
        "generation_config.json", "training_config.yaml", "training_config_pretrain.yaml", "evaluation/preference.json",
        "evaluation/preference_per_token.csv", "evaluation/report.md", "evaluation/logprob_scatter.png", "evaluation/preference_histogram.png",
        "evaluation/preference_vs_frequency.png", "evaluation/tokens.html",
    }  # fmt: skip
    code_files = {path.name for path in model_dir.glob("*.py")}  # the modeling files and the ones they import
    assert {"configuration_twotower.py", "modeling_twotower.py"} <= code_files
    assert files == expected | code_files
    config = json.loads((staged_repo / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_twotower.TwoTowerForCausalLM"
    assert (staged_repo / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    report = json.loads((report_dir / "preference.json").read_text())
    assert json.loads((staged_repo / "evaluation/preference.json").read_text()) == portable(report)
    assert not list(staged_repo.parent.glob(".twotower-test.*")), "the temporary staging folder was left behind"


def test_staged_repo_carries_no_local_path(trained_run, staged_repo, tmp_path_factory):
    model_dir, report_dir = trained_run
    local = str(tmp_path_factory.getbasetemp())  # every folder of this session lies under it
    assert local in (model_dir / "training_config.yaml").read_text()  # the local files hold such paths...
    assert local in (report_dir / "preference.json").read_text() and local in (report_dir / "report.md").read_text()
    for path in staged_repo.rglob("*"):  # ...the staged ones none
        assert path.is_dir() or local.encode() not in path.read_bytes(), path
    staged = yaml.safe_load((staged_repo / "training_config.yaml").read_text())
    assert staged["train_file"] == "wikitext-2/train.txt" and staged["pretrained_model"] == "pretrain/model"
    assert staged["output_dir"] == f"{model_dir.parent.parent.name}/probe"  # the last two parts of the folder
    report = json.loads((staged_repo / "evaluation/preference.json").read_text())
    assert report["model"]["path"] == "probe/model" and report["data"]["validation_file"] == "wikitext-2/valid.txt"
    assert "Model: `probe/model`" in (staged_repo / "evaluation/report.md").read_text()


def test_saved_and_staged_tokenizers_fit_the_model_and_carry_no_loading_flags(trained_run, staged_repo):
    model_dir, _ = trained_run
    positions = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    for folder in (model_dir.parent.parent / "pretrain" / "model", model_dir, staged_repo):
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
        assert tokenizer_config["model_max_length"] == positions == 128, folder
        assert not {"is_local", "local_files_only"} & set(tokenizer_config), folder


def test_the_probe_phase_records_its_steps_and_scoring_refuses_the_pretrained_model(trained_run, tmp_path):
    model_dir, report_dir = trained_run
    pretrained_dir = model_dir.parent.parent / "pretrain" / "model"
    assert json.loads((model_dir / "config.json").read_text())["probe_training_steps"] == 10  # max_train_steps
    assert json.loads((pretrained_dir / "config.json").read_text()).get("probe_training_steps") is None
    assert TwoTowerForCausalLM.from_pretrained(model_dir).config.probe_training_steps == 10
    with pytest.raises(TwoTowerUserError, match=f"{pretrained_dir} has untrained probes"):
        score_model(pretrained_dir, tmp_path / "report", block_size=32, cpu=True)
    assert json.loads((report_dir / "preference.json").read_text())["summary"]["num_predictions"] > 0


def test_a_full_disk_while_staging_removes_the_staging_folder(trained_run, tmp_path, monkeypatch):
    model_dir, report_dir = trained_run
    copyfile, copied = shutil.copyfile, []

    def fill_the_disk_on_the_second_file(source, target):
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        copied.append(copyfile(source, target))

    monkeypatch.setattr(shutil, "copyfile", fill_the_disk_on_the_second_file)
    for stage, output_dir in (
        (lambda: stage_model_repo(model_dir, tmp_path / "repo", REPO_ID, report_dir), tmp_path / "repo"),
        (lambda: stage_metric_space(tmp_path), tmp_path / "tower_preference"),
    ):
        copied.clear()
        with pytest.raises(TwoTowerUserError, match=f"(?i)no space left on device while writing {output_dir}"):
            stage()
        assert copied and list(tmp_path.iterdir()) == [], "a staging folder was left behind"


def test_damaged_or_diverged_weights_are_not_published(trained_run, tmp_path):
    model_dir, _ = trained_run
    damaged = tmp_path / "damaged"
    shutil.copytree(model_dir, damaged)
    data = (damaged / "model.safetensors").read_bytes()
    (damaged / "model.safetensors").write_bytes(data[:-100])
    with pytest.raises(TwoTowerUserError, match=f"{damaged / 'model.safetensors'} is not a readable safetensors"):
        stage_model_repo(damaged, tmp_path / "repo", REPO_ID)
    weights = load_file(model_dir / "model.safetensors")
    name = sorted(weights)[0]
    save_file({**weights, name: torch.full_like(weights[name], float("inf"))}, damaged / "model.safetensors",
              metadata={"format": "pt"})
    with pytest.raises(TwoTowerUserError, match=f"holds non-finite weights \\(NaN or infinity\\) in `{name}`"):
        stage_model_repo(damaged, tmp_path / "repo", REPO_ID)
    assert not (tmp_path / "repo").exists()


def test_card_metadata_validates_offline_and_holds_the_real_numbers(trained_run, staged_repo):
    model_dir, report_dir = trained_run
    report = json.loads((report_dir / "preference.json").read_text())
    card = ModelCard.load(staged_repo / "README.md")  # parses the YAML header as the Hub does

    # The offline part of ModelCard.validate(): required fields, a round trip, and a model-index that parses.
    metadata = card.data.to_dict()
    assert ModelCardData(**metadata).to_dict() == metadata
    assert metadata["license"] == "apache-2.0" and metadata["library_name"] == "transformers"
    assert metadata["pipeline_tag"] == "text-generation" and "custom_code" in metadata["tags"]
    # local text is no Hub dataset: no dataset id, and no model-index (which needs one), unless --dataset_id names it
    assert "datasets" not in metadata and "model-index" not in metadata
    named = render_model_card(model_dir, REPO_ID, report_dir, dataset_id="wikitext").data.to_dict()
    assert named["datasets"] == ["wikitext"] and ModelCardData(**named).to_dict() == named
    model_name, results = model_index_to_eval_results(named["model-index"])
    assert model_name == "twotower-test"
    measured = [report["perplexity"]["joint"], *report["perplexity"]["probes"]]
    assert [result.metric_name for result in results] == [
        "Perplexity (joint model)", "Perplexity (probe of tower 0)", "Perplexity (probe of tower 1)"
    ]
    assert [result.metric_value for result in results] == pytest.approx(measured, abs=1e-4)
    assert {(result.metric_type, result.dataset_split, result.task_type) for result in results} == {
        ("perplexity", "validation", "text-generation")
    }

    # The text: sizes and parameters counted independently, the recipe, the results, the plots, the citation.
    model = TwoTowerForCausalLM.from_pretrained(model_dir)
    num_probe_parameters = sum(param.numel() for param in model.probes.parameters())
    num_parameters = model.num_parameters() - num_probe_parameters
    text = card.text
    assert f"| Parameters | {num_parameters:,} in the joint model + {num_probe_parameters:,} in the probes |" in text
    assert "| Towers | 2 |" in text and "| Width of one tower (`hidden_size`) | 32 (fused width 64) |" in text
    assert "| Length | 20 optimizer steps |" in text and "| Length | 10 optimizer steps |" in text
    assert "AdamW, learning rate 0.001, betas (0.9, 0.98)" in text and "Hardware: 2 CPU cores." in text
    for value in measured:
        assert f"| {value:.2f} |" in text
    summary = report["summary"]
    assert f"| Predictions scored | {summary['num_predictions']:,} |" in text
    assert f"{summary['num_significant']:,} of {summary['num_eligible_types']:,}" in text
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    top_token = json.dumps(tokenizer.decode([summary["top_token_ids"][0][0]]), ensure_ascii=False)
    assert f"`{top_token}` ({summary['top_preference_nats'][0][0]:+.2f})" in text
    for plot, file_name in PLOTS.items():
        assert f"![{PLOT_CAPTIONS[plot]}](evaluation/{file_name})" in text
    assert 'trust_remote_code=True, revision=revision' in text and "masked-LM" in text
    assert "arXiv:2210.07041" in text and "{{" not in text


def test_every_plot_of_a_report_has_a_caption_in_the_card():
    assert set(PLOT_CAPTIONS) == set(PLOTS) | set(REPLICA_PLOTS)


def _blob_name(path: Path) -> str:
    """The blob name huggingface_hub gives a downloaded file: sha256 for LFS files, the git blob sha1 otherwise."""
    data = path.read_bytes()
    if path.suffix == ".safetensors":  # stored with Git LFS on the Hub
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def place_in_hub_cache(folder: Path, hub_cache: Path, repo_id: str) -> str:
    """Lay `folder` out as huggingface_hub's cache does after a download of `repo_id`; returns the commit hash."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    commit = hashlib.sha1("".join(_blob_name(path) for path in files).encode()).hexdigest()
    repo_cache = hub_cache / f"models--{repo_id.replace('/', '--')}"
    (repo_cache / "blobs").mkdir(parents=True)
    (repo_cache / "refs").mkdir()
    (repo_cache / "refs" / "main").write_text(commit)
    for path in files:
        blob = repo_cache / "blobs" / _blob_name(path)
        shutil.copyfile(path, blob)
        link = repo_cache / "snapshots" / commit / path.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return commit


LOAD_FROM_CACHE = """
import sys
sys.modules["modeling_twotower"] = None  # the package must not be importable: the Hub's custom code runs
sys.modules["twotower"] = None
try:
    import modeling_twotower
    raise SystemExit("modeling_twotower is importable")
except ImportError:
    pass
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

repo_id, commit, prompt, output = sys.argv[1:]
outputs = {}
for name, revision in (("main", None), ("pinned", commit)):
    model = AutoModelForCausalLM.from_pretrained(repo_id, trust_remote_code=True, revision=revision)
    tokenizer = AutoTokenizer.from_pretrained(repo_id, revision=revision)
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    input_ids = tokenizer(prompt, return_tensors="pt").input_ids
    outputs[f"{name}.input_ids"] = input_ids
    outputs[f"{name}.logits"] = model(input_ids).logits.detach()
    outputs[f"{name}.probe_logprobs"] = model.probe_logprobs(input_ids).detach()
    outputs[f"{name}.generated"] = model.generate(input_ids, max_new_tokens=8, do_sample=False)
save_file({key: value.contiguous() for key, value in outputs.items()}, output)
"""


def test_staged_repo_loads_from_a_hub_cache_offline_without_the_package(trained_run, staged_repo, tmp_path):
    model_dir, _ = trained_run
    hf_home = tmp_path / "hf_home"
    commit = place_in_hub_cache(staged_repo, hf_home / "hub", REPO_ID)
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "PYTHONPATH"))}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", HF_TOKEN=FAKE_TOKEN, OMP_NUM_THREADS="1")
    command = [sys.executable, "-c", LOAD_FROM_CACHE, REPO_ID, commit, PROMPT, str(tmp_path / "outputs.safetensors")]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert FAKE_TOKEN not in result.stdout + result.stderr
    outputs = load_file(tmp_path / "outputs.safetensors")

    model = TwoTowerForCausalLM.from_pretrained(model_dir)  # the original, through the installed package
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    input_ids = tokenizer(PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids).logits
        probe_logprobs = model.probe_logprobs(input_ids)
    generated = model.generate(input_ids, max_new_tokens=8, do_sample=False)
    for name in ("main", "pinned"):
        torch.testing.assert_close(outputs[f"{name}.input_ids"], input_ids, rtol=0, atol=0)
        torch.testing.assert_close(outputs[f"{name}.logits"], logits, rtol=0, atol=1e-6)
        assert outputs[f"{name}.probe_logprobs"].shape == (2, 1, input_ids.shape[1] - 1)
        torch.testing.assert_close(outputs[f"{name}.probe_logprobs"], probe_logprobs, rtol=0, atol=1e-6)
        torch.testing.assert_close(outputs[f"{name}.generated"], generated, rtol=0, atol=0)
    assert generated.shape == (1, input_ids.shape[1] + 8)


STAGE_FROM_INSTALLED_WHEEL = """
import sys
from twotower.evaluation.publishing.model_card import model_card_template
from twotower.evaluation.publishing.publish import stage_model_repo

print(model_card_template())
stage_model_repo(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], hardware=sys.argv[5])
"""


def test_an_installed_wheel_publishes_with_its_own_model_card_template(trained_run, staged_repo, tmp_path):
    model_dir, report_dir = trained_run
    # build from a copy of the sources: a build leaves build/ and egg-info folders where it runs
    repository = Path(__file__).resolve().parents[2]
    source = tmp_path / "source"
    source.mkdir()
    for name in ("setup.py", "README.md", "model_card.md"):
        shutil.copy2(repository / name, source / name)
    for name in ("modeling_twotower", "training", "evaluation"):
        shutil.copytree(repository / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=HANG_LIMIT_S,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("twotower-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        card = archive.read("twotower/evaluation/publishing/model_card.md")
        assert card == (repository / "model_card.md").read_bytes()
        shipped = set(archive.namelist())
    # every data file of the package's folders ships: templates, recipes, the lm-eval task, the metric's files
    data_files = {
        f"twotower/{path.relative_to(repository).as_posix()}"
        for folder in ("training", "evaluation") for path in (repository / folder).rglob("*")
        if path.is_file() and path.suffix not in (".py", ".pyc") and "__pycache__" not in path.parts
    } | {"twotower/evaluation/lm_eval_task/utils.py", "twotower/evaluation/tower_preference/app.py"}
    assert data_files <= shipped, sorted(data_files - shipped)
    site = tmp_path / "site"
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--target", str(site), str(wheel)], capture_output=True, text=True, timeout=HANG_LIMIT_S
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    # only the wheel's files on the path of the package, run from a folder outside the repository
    env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "PYTHONPATH"))}
    env.update(PYTHONPATH=str(site), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    output_dir = tmp_path / "staged"
    arguments = [str(model_dir), str(output_dir), REPO_ID, str(report_dir), "2 CPU cores"]  # as staged_repo
    command = [sys.executable, "-c", STAGE_FROM_INSTALLED_WHEEL, *arguments]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=HANG_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == str(site / "twotower" / "evaluation" / "publishing" / "model_card.md")
    assert (output_dir / "README.md").read_text() == (staged_repo / "README.md").read_text()


@pytest.fixture
def mocked_hub(monkeypatch):
    """HfApi's network calls replaced by mocks, online (the suite runs with HF_HUB_OFFLINE=1, which forbids uploads),
    with a fake token that the mocked Hub accepts with write access."""
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    commit = SimpleNamespace(commit_url=f"https://huggingface.co/{REPO_ID}/commit/0123abcd")
    writer = {"name": "someone", "auth": {"accessToken": {"role": "write"}}}
    with (
        mock.patch.object(HfApi, "whoami", return_value=writer),
        mock.patch.object(HfApi, "create_repo") as create_repo,
        mock.patch.object(HfApi, "create_branch") as create_branch,
        mock.patch.object(HfApi, "upload_folder", return_value=commit) as upload_folder,
    ):
        yield SimpleNamespace(create_repo=create_repo, create_branch=create_branch, upload_folder=upload_folder)


def test_publish_uploads_with_create_repo_and_upload_folder_and_never_prints_the_token(
    trained_run, tmp_path, mocked_hub, capsys
):
    model_dir, report_dir = trained_run
    output_dir = tmp_path / "repo"
    publish_main([
        "--model_dir", str(model_dir), "--report_dir", str(report_dir), "--repo_id", REPO_ID,
        "--output_dir", str(output_dir), "--private", "--revision", "v0.1", "--commit_message", "First two-tower model",
    ])  # fmt: skip
    mocked_hub.create_repo.assert_called_once_with(
        REPO_ID, repo_type="model", private=True, exist_ok=True, space_sdk=None
    )
    mocked_hub.create_branch.assert_called_once_with(REPO_ID, branch="v0.1", repo_type="model", exist_ok=True)
    mocked_hub.upload_folder.assert_called_once_with(
        repo_id=REPO_ID, folder_path=str(output_dir.resolve()), repo_type="model", revision="v0.1",
        commit_message="First two-tower model",
    )  # fmt: skip
    assert 'revision="v0.1"' in (output_dir / "README.md").read_text()
    captured = capsys.readouterr()
    assert captured.out.startswith(f"Staged {output_dir.resolve()}:\n")
    assert captured.out.endswith(f" files\nUploaded to https://huggingface.co/{REPO_ID}/commit/0123abcd\n")
    assert FAKE_TOKEN not in captured.out + captured.err


def test_dry_run_stages_and_lists_the_files_without_uploading(trained_run, tmp_path, mocked_hub, capsys):
    model_dir, _ = trained_run
    output_dir = tmp_path / "repo"
    publish_main(["--model_dir", str(model_dir), "--repo_id", REPO_ID, "--output_dir", str(output_dir), "--dry-run"])
    assert not (mocked_hub.create_repo.called or mocked_hub.create_branch.called or mocked_hub.upload_folder.called)
    out = capsys.readouterr().out
    size = (model_dir / "model.safetensors").stat().st_size
    assert f"{size:>12,}  model.safetensors" in out and "README.md" in out
    assert f"Dry run: nothing uploaded (would upload to {REPO_ID}@main)." in out
    assert "No evaluation report was staged" in (output_dir / "README.md").read_text()


def test_unpublishable_model_folders_raise_clear_errors(trained_run, tmp_path):
    model_dir, _ = trained_run
    broken = tmp_path / "model"
    shutil.copytree(model_dir, broken)
    (broken / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(ValueError, match="pickled files \\['pytorch_model.bin'\\]"):
        stage_model_repo(broken, tmp_path / "repo", REPO_ID)
    (broken / "pytorch_model.bin").unlink()
    (broken / "tokenizer_config.json").unlink()
    with pytest.raises(FileNotFoundError, match="lacks \\['tokenizer_config.json'\\]"):
        stage_model_repo(broken, tmp_path / "repo", REPO_ID)
    with pytest.raises(ValueError, match="would replace the model folder"):
        stage_model_repo(model_dir, model_dir.parent, REPO_ID)
    with pytest.raises(FileNotFoundError, match="has no preference.json"):
        stage_model_repo(model_dir, tmp_path / "repo", REPO_ID, report_dir=tmp_path)
    assert not (tmp_path / "repo").exists()


def test_metric_space_is_staged_and_loads_with_evaluate(tmp_path):
    folder = stage_metric_space(tmp_path)
    assert folder == tmp_path.resolve() / "tower_preference"
    assert sorted(path.name for path in folder.iterdir()) == sorted([*SPACE_FILES, "modeling_twotower"])
    assert {"app.py", "token_view.py", "token_view.html.j2", "token_kinds.py"} <= set(SPACE_FILES)
    # the model code the Space's app runs models with: this package's own
    model_code = sorted(path.name for path in MODEL_CODE_DIR.glob("*.py"))
    assert sorted(path.name for path in (folder / "modeling_twotower").glob("*.py")) == model_code
    assert "sdk: gradio" in (folder / "README.md").read_text()

    rng = np.random.default_rng(0)
    token_ids = rng.integers(0, 30, size=400)
    gold_logprobs = -rng.gamma(2.0, 1.0, size=(2, 400))  # [towers, predictions]
    gold_logprobs[1, token_ids < 10] -= 1.5  # token types 0-9 planted as preferring tower 0
    metric = evaluate.load(str(folder))
    results = metric.compute(token_ids=token_ids.tolist(), gold_logprobs=gold_logprobs.T.tolist(), min_count=5)
    expected = compute_preference(token_ids, gold_logprobs, min_count=5).to_dict()
    assert results.keys() == expected.keys()
    np.testing.assert_allclose(results["preference_nats"], expected["preference_nats"], rtol=1e-12)
    assert results["significant"] == expected["significant"] and results["top_token_ids"] == expected["top_token_ids"]
    assert set(results["top_token_ids"][0][:5]) <= set(range(10))


def test_metric_space_push_uploads_the_files_where_they_are_to_a_gradio_space(tmp_path, mocked_hub, capsys):
    publish_metric_main(["--repo_id", "tower-lab/tower_preference"])
    mocked_hub.create_repo.assert_called_once_with(
        "tower-lab/tower_preference", repo_type="space", private=False, exist_ok=True, space_sdk="gradio"
    )
    mocked_hub.create_branch.assert_not_called()
    common = dict(repo_id="tower-lab/tower_preference", repo_type="space", revision="main",
                  commit_message="Upload the tower preference metric")
    assert mocked_hub.upload_folder.call_args_list == [
        mock.call(**common, folder_path=str(MODEL_CODE_DIR), path_in_repo="modeling_twotower", allow_patterns=["*.py"]),
        mock.call(**common, folder_path=str(METRIC_DIR), allow_patterns=list(SPACE_FILES)),
    ]
    assert list(tmp_path.iterdir()) == []  # nothing staged
    # the patterns select exactly the files a dry run stages, byte for byte
    staged = stage_metric_space(tmp_path / "staged")
    uploaded = {}
    for call in mocked_hub.upload_folder.call_args_list:
        source, prefix = Path(call.kwargs["folder_path"]), call.kwargs.get("path_in_repo")
        names = [path.relative_to(source).as_posix() for path in source.rglob("*") if path.is_file()]
        for name in filter_repo_objects(names, allow_patterns=call.kwargs["allow_patterns"]):
            uploaded[f"{prefix}/{name}" if prefix else name] = (source / name).read_bytes()
    staged_files = {
        path.relative_to(staged).as_posix(): path.read_bytes() for path in staged.rglob("*") if path.is_file()
    }
    assert uploaded == staged_files
    out, err = capsys.readouterr()
    assert "to https://huggingface.co/" in out and FAKE_TOKEN not in out + err
    with pytest.raises(ValueError, match="pass --output_dir too"):
        publish_metric_main(["--repo_id", "tower-lab/tower_preference", "--dry-run"])
    with pytest.raises(ValueError, match="must be `user/tower_preference`"):
        publish_metric_main(["--output_dir", str(tmp_path), "--repo_id", "tower-lab/preference", "--dry-run"])


def test_model_code_that_is_not_the_packages_is_refused(trained_run, tmp_path, mocked_hub):
    model_dir, _ = trained_run
    tampered = tmp_path / "model"
    shutil.copytree(model_dir, tampered)
    for name in ("modeling_twotower.py", "configuration_twotower.py"):
        with open(tampered / name, "a", encoding="utf-8") as handle:
            handle.write("\nimport os\nos.system('echo the Hub would run this')\n")
    (tampered / "helpers.py").write_text("print('and this')\n")
    output_dir = tmp_path / "repo"
    with pytest.raises(TwoTowerUserError) as raised:
        publish_main(["--model_dir", str(tampered), "--repo_id", REPO_ID, "--output_dir", str(output_dir), "--dry-run"])
    message = str(raised.value)
    package_code = Path(sys.modules[TwoTowerForCausalLM.__module__].__file__).parent
    assert message.startswith(
        f"{tampered} holds model code that is not this package's ({package_code}): configuration_twotower.py and "
        f"modeling_twotower.py differ from it, helpers.py is not in it."
    )
    assert "\n" not in message and not output_dir.exists() and not mocked_hub.upload_folder.called


def test_every_factual_line_of_a_card_comes_from_the_run_or_the_faithfulness_table(trained_run, tmp_path, mocked_hub):
    """The main job's way: scored on --validation_file alone, published by a dry run; the card's facts against the
    run folder's records (training configs, config.json, preference.json) and docs/FAITHFULNESS.md (the paper's)."""
    model_dir, first_report = trained_run
    validation_file = yaml.safe_load((model_dir / "training_config.yaml").read_text())["validation_file"]
    report_dir = tmp_path / "report"
    score_model(model_dir, report_dir, validation_file=validation_file, block_size=32, min_count=3, disable_tqdm=True,
                cpu=True, token_view_blocks=0)
    output_dir = tmp_path / "repo"
    publish_main(["--model_dir", str(model_dir), "--repo_id", REPO_ID, "--output_dir", str(output_dir),
                  "--report_dir", str(report_dir), "--hardware", "2 CPU cores", "--dry-run"])
    text = ModelCard.load(output_dir / "README.md").text
    report = json.loads((report_dir / "preference.json").read_text())
    probe_config = yaml.safe_load((model_dir / "training_config.yaml").read_text())

    # what was scored: the local validation text, as preference.json records it (never a Hub dataset it was not)
    scored = re.search(r"^Scored on (.*?)\. The perplexities", text, re.M)[1]
    assert scored == f"local text `{short_path(validation_file)}`, {report['data']['num_blocks']:,} blocks of 32 tokens"
    assert "Hub dataset" not in text
    # the paper's schedule, as docs/FAITHFULNESS.md gives it (phase 1: steps and the global batch)
    faithfulness = (Path(__file__).resolve().parents[2] / "docs" / "FAITHFULNESS.md").read_text(encoding="utf-8")
    steps, batch = re.search(r"trained for\s+([\d,]+) optimizer steps with a global batch of (\d+) sequences", text).groups()
    assert f"`max_train_steps: {steps.replace(',', '')}`" in faithfulness and f"{batch} blocks a step" in faithfulness
    # each phase's length and learning rate, from its own record
    assert f"| Length | {probe_config['max_train_steps']} optimizer steps |" in text
    assert f"learning rate {probe_config['learning_rate']:g}" in text
    # the results: the perplexities and the summary's counts, from preference.json
    for value in (report["perplexity"]["joint"], *report["perplexity"]["probes"]):
        assert f"| {value:.2f} |" in text
    summary = report["summary"]
    assert f"| Predictions scored | {summary['num_predictions']:,} |" in text
    assert f"{summary['num_significant']:,} of {summary['num_eligible_types']:,}" in text

    # every number the card states anywhere in its prose and metadata comes from a record, and a wrong one is caught
    known = card_facts(output_dir, report, faithfulness)
    assert unexplained_numbers(text, known) == []
    perplexity = f"{report['perplexity']['joint']:.2f}"
    wrong_perplexity = f"{float(perplexity) + 0.01:.2f}"
    planted = text.replace(f"| {perplexity} |", f"| {wrong_perplexity} |", 1).replace(
        "trained for\n  ", "trained for\n  25 epochs of 5000 steps, ", 1
    )
    assert [number for number, _ in unexplained_numbers(planted, known)] == [wrong_perplexity, "25", "5000"]


def test_every_relative_link_of_the_staged_repository_resolves(staged_repo):
    """Every link and image of every Markdown file in the repository, rendered as the Hub renders it, that is not
    a URL names a file the repository ships."""
    links = {}
    for page in sorted(staged_repo.rglob("*.md")):
        html = markdown.markdown(page.read_text(encoding="utf-8"), extensions=["tables", "fenced_code"])
        for target in map(unescape, re.findall(r'(?:href|src)="([^"]*)"', html)):
            if not (urlsplit(target).scheme or target.startswith("#")):
                path = (page.parent / unquote(urlsplit(target).path)).resolve()
                links[f"{page.relative_to(staged_repo).as_posix()} -> {target}"] = path
    assert {"README.md -> evaluation/report.md", "evaluation/report.md -> tokens.html"} <= set(links)
    missing = [link for link, path in links.items() if not (path.is_relative_to(staged_repo) and path.is_file())]
    assert missing == []


@pytest.mark.slow
def test_the_cards_rerun_commands_work_in_a_copy_of_the_downloaded_repository(trained_run, staged_repo, tmp_path):
    """The commands the card prints, run as written inside a copy of the staged folder (where its modeling_twotower.py
    lies beside them), the training text put where the staged configs name it and the steps cut to 2: they retrain
    both phases with the recipe the run recorded."""
    model_dir, _ = trained_run
    folder = tmp_path / "twotower-test"
    shutil.copytree(staged_repo, folder)
    recorded = yaml.safe_load((model_dir / "training_config.yaml").read_text())
    recipes = {"pretrain": "training_config_pretrain.yaml", "probe": "training_config.yaml"}
    staged = {phase: yaml.safe_load((folder / name).read_text()) for phase, name in recipes.items()}
    for key in ("train_file", "validation_file"):
        (folder / staged["probe"][key]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(recorded[key], folder / staged["probe"][key])
    card = ModelCard.load(folder / "README.md").text
    commands = re.search(r"these commands rerun both phases.*?```bash\n(.*?)```", card, re.S)[1].splitlines()
    assert len(commands) == 2 and all(command.startswith("python -I -m ") for command in commands)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for command in commands:
        command = f"{command.replace('python', shlex.quote(sys.executable), 1)} --max_train_steps 2"
        result = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True,
                                timeout=HANG_LIMIT_S)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    for phase, config in staged.items():
        rerun = yaml.safe_load((folder / "rerun" / phase / "model" / "training_config.yaml").read_text())
        changed = sorted(key for key in config if rerun[key] != config[key])
        probe_only = ["pretrained_model"] if phase == "probe" else []
        assert changed == ["max_train_steps", "output_dir", *probe_only, "recipe"]
        assert rerun["max_train_steps"] == 2 and rerun["output_dir"] == f"rerun/{phase}"
        assert rerun["recipe"] == recipes[phase] and rerun.get("pretrained_model") in (None, "rerun/pretrain/model")
    assert json.loads((folder / "rerun/probe/model/config.json").read_text())["probe_training_steps"] == 2


# Planted reports of the tiny run: the main job's numbers (outputs/tiny: probes below the joint model, an ablation
# agreement that cannot be told from 0, replica-level tests) and their opposites. `beyond`: which of each tower's top
# tokens the per-type test passes; `verdict`: the words the agreement must be given.
CARD_CASES = {
    "main job": dict(joint=252.39, probes=[248.81, 250.57], agreement=(-0.04, [-0.16, 0.07]), replicas=True,
                     beyond="none", verdict="They do not agree", license=None, precision=None),
    "probes worse, agreeing": dict(joint=252.39, probes=[260.12, 271.5], agreement=(0.81, [0.62, 0.9]),
                                   replicas=False, beyond="all", verdict="They agree:", license="mit",
                                   precision="bf16"),
    "one probe better, opposite": dict(joint=252.39, probes=[248.81, 260.0], agreement=(-0.72, [-0.88, -0.41]),
                                       replicas=True, beyond="alternate", verdict="They point opposite ways",
                                       license="cc-by-4.0", precision="fp16"),
    "no ablation": dict(joint=30.0, probes=[35.5, 29.25], agreement=None, replicas=False, beyond="alternate",
                        verdict=None, license=None, precision=None),
}  # fmt: skip


def planted_run(model_dir: Path, report_dir: Path, folder: Path, case: dict) -> tuple[Path, Path, set[int]]:
    """Copies of the model folder and its report with the case's figures planted: (model folder, report folder,
    the token ids beyond noise)."""
    shutil.copytree(model_dir, folder / "model")
    config_path = folder / "model" / "training_config.yaml"
    config = yaml.safe_load(config_path.read_text())
    config_path.write_text(yaml.safe_dump({**config, "mixed_precision": case["precision"]}, sort_keys=False))
    shutil.copytree(report_dir, folder / "report")
    report = json.loads((folder / "report" / "preference.json").read_text())
    report["perplexity"] = {"joint": case["joint"], "probes": case["probes"]}
    if case["agreement"] is None:
        del report["ablation"]
    else:
        r, ci = case["agreement"]
        report["ablation"] |= {"correlation_with_probe_preference": r, "correlation_with_probe_preference_ci": ci}
    summary = report["summary"]
    if case["replicas"]:
        summary |= {"test": "replica", "reliability": 0.41, "reliability_ci": [0.22, 0.63],
                    "probe_towers": [0, 0, 1, 1], "two_tower_difference_nats": 0.12, "same_tower_floor_nats": 0.05,
                    "occurrence_num_significant": summary["num_significant"],
                    "occurrence_significant_share": summary["significant_share"]}  # fmt: skip
    (folder / "report" / "preference.json").write_text(json.dumps(report))
    top = [token_id for token_ids in summary["top_token_ids"] for token_id in token_ids[:TOP_TOKENS_IN_CARD]]
    beyond = {"none": set(), "all": set(top), "alternate": set(top[::2])}[case["beyond"]]
    table = pd.read_csv(folder / "report" / "preference_per_token.csv")
    table["significant"] = table["token_id"].isin(beyond)
    table.to_csv(folder / "report" / "preference_per_token.csv", index=False)
    return folder / "model", folder / "report", beyond


@pytest.mark.parametrize("case", CARD_CASES)
def test_every_run_dependent_sentence_of_the_card_follows_the_runs_numbers(trained_run, tmp_path, case):
    model_dir, report_dir, beyond = planted_run(*trained_run, tmp_path, CARD_CASES[case])
    license = CARD_CASES[case]["license"]
    card = render_model_card(model_dir, REPO_ID, report_dir, **({"license": license} if license else {}))
    report = json.loads((report_dir / "preference.json").read_text())
    configs = [yaml.safe_load((model_dir / "training_config.yaml").read_text())]
    configs.insert(0, yaml.safe_load((Path(configs[0]["pretrained_model"]) / "training_config.yaml").read_text()))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    check_card_sentences(card, report, configs, beyond, CARD_CASES[case]["verdict"], tokenizer)


def check_card_sentences(card, report, configs, beyond, verdict, tokenizer) -> None:
    """Each sentence of the card that depends on the run, against the run's numbers (report: preference.json;
    configs: each phase's training config; beyond: the token ids the per-type test passes)."""
    text = card.text
    flat = " ".join(text.split())
    joint, probes = report["perplexity"]["joint"], report["perplexity"]["probes"]

    # the probes against the joint model: each tower's side as the numbers have it
    sentence = re.search(r"Each probe reads a single tower; (.*?)\. \|", flat)[1]
    sides = ["below" if probe < joint else "above" if probe > joint else "equal to" for probe in probes]
    one_side = {"every probe's perplexity is above": "above", "yet every probe's perplexity is below": "below"}
    side = next((side for start, side in one_side.items() if sentence.startswith(start)), None)
    if side is not None:
        assert set(sides) == {side}, sentence
    else:
        stated = {int(tower): side for towers, side in re.findall(r"of towers? ([\d, and]+?) is (below|equal to|above)",
                                                                   sentence) for tower in re.findall(r"\d+", towers)}
        assert stated == dict(enumerate(sides)), sentence
    assert "expected to be worse" not in flat

    # what the joint model relies on: the ablation agreement, its interval and words that fit them
    ablation = report.get("ablation")
    if ablation is None:
        assert "This report has no ablation" in flat and "They agree" not in flat
    else:
        r, (low, high) = ablation["correlation_with_probe_preference"], ablation["correlation_with_probe_preference_ci"]
        assert f"r = {r:.2f} (95% bootstrap interval over types {low:.2f} to {high:.2f}). {verdict}" in flat
        assert ("They agree" in flat) <= (low > 0) and ("opposite ways" in flat) <= (r < 0)
        assert ("They do not agree" in flat) <= (low <= 0 <= high)

    # significance always names its correction: in each table row, each paragraph of prose
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    for paragraph in prose.split("\n\n"):
        parts = paragraph.splitlines() if paragraph.startswith("|") else [paragraph]
        for part in parts:
            if re.search(r"significant|beyond probe noise", part, re.I):
                assert "Benjamini-Hochberg" in part, part

    # top tokens: the ones the per-type test passes apart from the others, with their preferences
    summary = report["summary"]
    for tower, (token_ids, nats) in enumerate(zip(summary["top_token_ids"], summary["top_preference_nats"])):
        paragraph = re.search(rf"^Tokens preferred most by tower {tower} \(nats\), (.*?)\n\n", text, re.M | re.S)[1]
        line = " ".join(paragraph.split())
        passing, _, failing = line.partition("(their preference may be noise): ")
        shown = list(zip(token_ids, nats))[:TOP_TOKENS_IN_CARD]
        for part, passes in ((passing, True), (failing, False)):
            listed = re.findall(r'`("(?:[^"\\]|\\.)*")` \(([+-]\d+\.\d\d)\)', part)
            expected = [(json.dumps(tokenizer.decode([token_id]), ensure_ascii=False), f"{value:+.2f}")
                        for token_id, value in shown if (token_id in beyond) == passes]
            assert listed == expected, (passes, line)
        assert (": none." in passing) == (not beyond & set(token_ids[:TOP_TOKENS_IN_CARD]))

    # names from the run: the layout, each phase's precision as recorded, the data, the license
    layout = json.loads((Path(configs[-1]["pretrained_model"]) / "config.json").read_text())["layout"]
    assert layout == "bert" and "GPT-style" not in text and "(the reference code's BERT layout)" in flat
    precisions = re.findall(r"^\| Precision \| (.*) \|$", text, re.M)
    assert [config["precision"] for config in configs] == ["no", "no"]  # as Accelerate ran them, on the CPU
    assert precisions == ["fp32", "fp32"]
    metadata = card.data.to_dict()
    assert "Hub dataset" not in text and "datasets" not in metadata
    chosen = card.data.license
    assert f"## License `{chosen}`, " in flat
    assert ("chosen by the publisher" in flat) != ("the publisher chose none" in flat)


def test_the_rerun_switches_of_a_staged_training_config_are_cleared(trained_run, tmp_path):
    """A config recorded by a resumed run that uploaded itself stages as a recipe that starts a new run: `--recipe`
    on the staged copy neither resumes from the author's checkpoints nor uploads to the author's repository."""
    model_dir, _ = trained_run
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    config = yaml.safe_load((folder / "training_config.yaml").read_text())
    switches = {"resume_from_checkpoint": "latest", "push_to_hub": True, "hub_model_id": "someone/tiny"}
    (folder / "training_config.yaml").write_text(yaml.safe_dump(config | switches, sort_keys=False))
    staged = stage_model_repo(folder, tmp_path / "repo", REPO_ID)
    rerun = load_config(str(staged / "training_config.yaml"), ["--output_dir", str(tmp_path / "rerun")])
    assert rerun.resume_from_checkpoint is None and rerun.push_to_hub is False
    assert rerun.hub_model_id == "someone/tiny" and rerun.seed == config["seed"]  # the rest as recorded

# Facts a card states that no run record holds: the paper's citation, the intervals' level and Sarle's threshold.
CARD_CONSTANTS = {2022.0: "the paper's year", 2210.07041: "its arXiv id", 95.0: "95% intervals", 0.556: "5/9"}
CARD_NUMBER = re.compile(r"(?<![\w.`/-])[-+]?\d[\d,]*(?:\.\d+)?(?:e-?\d+)?%?")


def numeric_leaves(value) -> list[float]:
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in numeric_leaves(item)]
    return [float(value)] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def card_facts(repo_dir, report, faithfulness) -> set[float]:
    """Every number the staged repository's records hold: config.json, both phases' training configs,
    preference.json, the parameter counts of the saved weights, the tokenizer's size, and the paper's."""
    # the per-type tags of preference.json are keyed by token id, numbers the card never states
    parts_of_speech = {key: value for key, value in (report.get("parts_of_speech") or {}).items() if key != "types"}
    records = [json.loads((repo_dir / "config.json").read_text()), report | {"parts_of_speech": parts_of_speech}]
    records += [yaml.safe_load(path.read_text()) for path in repo_dir.glob("training_config*.yaml")]
    known = {leaf for record in records for leaf in numeric_leaves(record)}
    sizes = {name: tensor.numel() for name, tensor in load_file(repo_dir / "model.safetensors").items()}
    known.add(float(sum(size for name, size in sizes.items() if not name.startswith("probe"))))
    known.add(float(sum(size for name, size in sizes.items() if name.startswith("probe"))))
    known.add(float(AutoTokenizer.from_pretrained(repo_dir).vocab_size))
    return known | paper_facts(faithfulness) | set(CARD_CONSTANTS)


def paper_facts(faithfulness) -> set[float]:
    """The paper's base size and phase-1 schedule as docs/FAITHFULNESS.md gives them: layers and width of the base
    towers, optimizer steps and blocks a step."""
    layers, width = re.search(r"and (\d+)/\d+/(\d+)/\d+\)", faithfulness).groups()
    steps = re.search(r"`max_train_steps: (\d+)`", faithfulness)[1]
    batch = re.search(r"(\d+) blocks a step", faithfulness)[1]
    return {float(layers), float(width), float(steps), float(batch)}


def unexplained_numbers(card_text, known) -> list[tuple[str, str]]:
    """(number, line) for each number outside the card's code that no record gives at the precision shown
    (a percentage may be a recorded share times 100)."""
    prose = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", card_text, flags=re.S))  # code and token texts
    unexplained = []
    for line in prose.splitlines():
        for match in CARD_NUMBER.finditer(line):
            written = match.group(0).replace(",", "").lstrip("+").rstrip("%")
            decimals = None if "e" in written else len(written.partition(".")[2])
            candidates = known | ({100 * value for value in known} if match.group(0).endswith("%") else set())
            if not any(shown(value, decimals) == float(written) for value in candidates):
                unexplained.append((match.group(0), line))
    return unexplained


def shown(value, decimals):
    return value if decimals is None else round(value, decimals)
