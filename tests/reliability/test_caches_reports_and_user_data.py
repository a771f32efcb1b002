"""
Round three of docs/RELIABILITY.md: the feature cache, concurrent reports, the study's kept files, Markdown built
from user data and the Space's model field. Each case gives one clear error (on the command line, one `error:` line
with exit status 2) before any long work, and loses nothing.
"""

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from modeling_twotower import TwoTowerCheckpointError, TwoTowerConfig, TwoTowerForCausalLM
from test_probe_feature_cache import corpus, models, probe_config  # noqa: F401 (fixtures of the probe phase)
from test_wrong_models_and_inputs import assert_one_error_line, command, text_file  # noqa: F401 (round two's fixtures)
from twotower.evaluation.scoring import score
from twotower.evaluation.study import driver as study
from twotower.evaluation.scoring.ablation import MeanAblation
from twotower.evaluation.study.kept_files import check_kept_run, set_aside_if_damaged
from twotower.training.feature_cache import probe_cache
from twotower.training.run import run_setup
from twotower.training.feature_cache.feature_cache_checks import ShardChanged, ShardWriter
from twotower.training.run.run_folder import output_dir_lock, prepare_new_run
from twotower.training.data.tokenizer import train_bpe_tokenizer
from twotower.training.train import training_function
from twotower.training.utils import cli
from twotower.training.utils.errors import TwoTowerUserError

VOCAB_SIZE = 96


# 1. every field of an edited config is named by its own name


@pytest.mark.parametrize("field, edited, saved", [("hidden_size", 64, 32), ("max_position_embeddings", 64, 128),
                                                  ("intermediate_size", 128, 256)])  # fmt: skip
def test_an_edited_field_is_named_though_another_field_has_the_size(field, edited, saved, tmp_path):
    # hidden_size 32 and max_position_embeddings 128: a fused width of 2 x 64 = 128 once hidden_size reads 64
    config = TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE, hidden_size=32, max_position_embeddings=128)
    assert getattr(config, field) == saved
    TwoTowerForCausalLM(config).save_pretrained(tmp_path)
    fields = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**fields, field: edited}))
    with pytest.raises(TwoTowerCheckpointError) as raised:
        TwoTowerForCausalLM.from_pretrained(tmp_path)
    message = str(raised.value)
    assert f"sets `{field}` to {edited}, but its weights were saved with {saved}" in message, message
    assert f'Set `"{field}": {saved}`' in message


# 2. a report folder is locked while a report is scored into it


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, text_file):
    """A tiny causal model with trained-probe records and a BPE trained on the text, as training saves them."""
    tokenizer = train_bpe_tokenizer(iter([text_file.read_text(encoding="utf-8").splitlines()]), 320)
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=320, max_position_embeddings=16, probe_training_steps=1)
    folder = tmp_path_factory.mktemp("model")
    TwoTowerForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_second_score_into_a_locked_report_folder_fails_at_once_and_keeps_the_report(
    model_dir, text_file, tmp_path, command, monkeypatch, capsys
):
    report_dir = tmp_path / "report"
    options = ["--model_dir", model_dir, "--output_dir", report_dir, "--validation_file", text_file,
               "--block_size", 16, "--cpu", "true"]  # fmt: skip
    score.main([str(option) for option in options])
    capsys.readouterr()
    written = {path.name: path.read_bytes() if path.is_file() else None for path in report_dir.iterdir()}
    assert "report.md" in written and not [name for name in written if "lock" in name or name.endswith(".tmp")]
    loaded = []
    monkeypatch.setattr(score, "load_two_tower", lambda *args: loaded.append(args))
    with output_dir_lock(report_dir):  # another scoring run holds the folder
        status, stderr = command(score.main, options)
    assert_one_error_line(status, stderr, f"--output_dir {report_dir} is in use by another run (process {os.getpid()}")
    assert not loaded  # refused before the model was loaded
    assert {path.name: path.read_bytes() if path.is_file() else None for path in report_dir.iterdir()} == written


def test_report_staging_folders_are_unique_to_the_process(tmp_path, monkeypatch):
    from twotower.evaluation.scoring import report

    staged = []
    real_files = report._write_report_files
    monkeypatch.setattr(report, "_write_report_files", lambda folder, *args: (staged.append(folder),
                                                                               real_files(folder, *args)))  # fmt: skip
    result = planted_result()
    metadata = {"model": {"path": "m"}, "data": {"description": "d", "num_blocks": 1, "block_size": 8},
                "perplexity": {"joint": 1.0, "probes": [1.0, 1.0]}}  # fmt: skip
    tokens = [f"t{token_id}" for token_id in result.token_ids]
    for _ in range(2):
        report.write_report(tmp_path, metadata, result, tokens)
    assert staged[0] != staged[1] and all(folder.parent == tmp_path and not folder.exists() for folder in staged)


def planted_result():
    from test_templates import two_tower_result

    return two_tower_result()


# 3, 8, 9. the disk feature cache: its budget, its checksums, and a shard changed under the run


def damage_on_second_read(monkeypatch, damage):
    """The probe run's disk cache damaged (by `damage(path)`) between its first and second read."""
    reads = []
    real_batch = probe_cache.FeatureCache.replica_batch

    def replica_batch(self, positions):
        reads.append(1)
        if len(reads) == 2:
            damage(self.shard.path)
        return real_batch(self, positions)

    monkeypatch.setattr(probe_cache.FeatureCache, "replica_batch", replica_batch)


def truncate(path):
    os.truncate(path, path.stat().st_size // 2)


def rewrite_with_random_bytes(path):
    path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


@pytest.mark.parametrize("damage, change", [(truncate, "it was cut to or grown to"),
                                            (rewrite_with_random_bytes, "it was rewritten")])  # fmt: skip
def test_a_cache_changed_under_the_run_stops_it_naming_the_shard(damage, change, models, corpus, tmp_path,
                                                                 monkeypatch):
    damage_on_second_read(monkeypatch, damage)
    with pytest.raises(ShardChanged) as raised:
        training_function(probe_config(models["causal"], corpus, tmp_path, probe_feature_cache="disk"))
    shard = tmp_path / probe_cache.CACHE_DIR / "train_process0.bin"
    assert str(raised.value).startswith(f"The probe feature cache {shard} changed while this run read it: {change}")
    assert "the cache is built anew" in str(raised.value)
    assert not list(tmp_path.glob(".run.lock*"))  # the run folder's lock released, its files removed


def test_a_shard_that_does_not_verify_when_mapped_is_built_again(models, corpus, tmp_path, monkeypatch, capsys):
    expected = training_function(probe_config(models["causal"], corpus, tmp_path / "clean", probe_feature_cache="disk"))
    closes = []
    real_close = ShardWriter.close

    def close_then_damage(self):
        real_close(self)
        closes.append(self.path)
        if len(closes) == 1:  # the first shard built: one byte flipped after its checksum was written
            data = bytearray(self.path.read_bytes())
            data[0] ^= 0xFF
            self.path.write_bytes(bytes(data))

    monkeypatch.setattr(ShardWriter, "close", close_then_damage)
    result = training_function(probe_config(models["causal"], corpus, tmp_path / "damaged", probe_feature_cache="disk"))
    shard = tmp_path / "damaged" / probe_cache.CACHE_DIR / "train_process0.bin"
    printed = capsys.readouterr().out
    assert f"The probe feature cache {shard} does not verify: its bytes do not match the sha256" in printed
    assert closes.count(shard) == 2  # built again, then trained on
    assert result["train_losses"] == expected["train_losses"] and result["eval_metrics"] == expected["eval_metrics"]


def test_an_explicit_disk_cache_over_its_budget_is_refused_before_the_towers_run(models, corpus, tmp_path,
                                                                               monkeypatch):
    built = []
    monkeypatch.setattr(probe_cache, "build_feature_cache", lambda *args, **kwargs: built.append(args))
    config = probe_config(models["causal"], corpus, tmp_path, probe_feature_cache="disk", probe_cache_max_gb=1e-9)
    with pytest.raises(TwoTowerUserError, match=r"> --probe_cache_max_gb 1e-09: --probe_feature_cache disk does not "
                                                r"fit its budget; raise --probe_cache_max_gb"):  # fmt: skip
        training_function(config)
    assert not built and not (tmp_path / probe_cache.CACHE_DIR).exists()


def test_every_explicit_cache_mode_honours_its_budget_or_says_why_none_applies():
    sizes = dict(probe_type="mlp", num_towers=2, hidden_size=4, dtype=torch.float32, train_positions=100,
                 validation_positions=25, free_memory_bytes=10_000, free_disk_bytes=1_000_000)  # fmt: skip
    cache_bytes = 125 * 2 * 4 * 4  # 4000 bytes
    assert probe_cache.plan_feature_cache("memory", **sizes).cache_bytes == cache_bytes
    with pytest.raises(TwoTowerUserError, match="= 4.0 kB > 4.0 kB, the free memory: --probe_feature_cache memory "
                                                "does not fit"):  # fmt: skip
        probe_cache.plan_feature_cache("memory", **{**sizes, "free_memory_bytes": cache_bytes - 1})
    with pytest.raises(TwoTowerUserError, match="the output folder's free disk: --probe_feature_cache disk does not"):
        probe_cache.plan_feature_cache("disk", **{**sizes, "free_disk_bytes": cache_bytes - 1})
    assert probe_cache.plan_feature_cache("disk", **sizes, probe_cache_max_gb=4e-6).message.endswith(
        "(<= --probe_cache_max_gb 4e-06)")
    for mode in ("memory", "none"):
        assert probe_cache.plan_feature_cache(mode, **sizes, probe_cache_max_gb=1e-9).message.endswith(
            f"(--probe_cache_max_gb bounds a disk cache only: not applied to --probe_feature_cache {mode})")


# 13. an option a probe checkpoint cannot be resumed with, refused before tokenizing


def test_a_probe_checkpoint_resumed_with_disjoint_replica_data_is_refused_before_tokenizing(
    models, corpus, tmp_path, monkeypatch
):
    training_function(probe_config(models["causal"], corpus, tmp_path, checkpointing_steps=2, max_train_steps=2,
                                   num_train_epochs=1))  # fmt: skip
    tokenized = []
    monkeypatch.setattr(run_setup, "tokenize_and_group", lambda *args, **kwargs: tokenized.append(args))
    resumed = probe_config(models["causal"], corpus, tmp_path, checkpointing_steps=2, max_train_steps=4,
                           num_train_epochs=1, resume_from_checkpoint="latest", probe_replica_data="disjoint",
                           allow_config_change=True)  # fmt: skip
    with pytest.raises(TwoTowerUserError) as raised:
        training_function(resumed)
    assert str(raised.value).startswith(f"--probe_replica_data disjoint cannot resume {tmp_path / 'checkpoints'}")
    assert "taken with --probe_replica_data shared, even with --allow_config_change" in str(raised.value)
    assert "Resume with --probe_replica_data shared" in str(raised.value)
    assert not tokenized


# 4. the study's kept files, checked as they are read


def kept_run(folder: Path, name: str) -> Path:
    """A kept run as keep_run_results leaves it: run.json, a text's preference.json and gzipped table."""
    kept = folder / name
    (kept / "scores" / "text").mkdir(parents=True)
    (kept / "run.json").write_text(json.dumps({"run": {"name": name}, "probe": {}}))
    (kept / "scores" / "text" / "preference.json").write_text(json.dumps({"summary": {}}))
    (kept / "scores" / "text" / "preference_per_token.csv.gz").write_bytes(gzip.compress(b"token_id,count\n1,2\n"))
    return kept


@pytest.mark.parametrize("damaged", ["run.json", "scores/text/preference.json",
                                     "scores/text/preference_per_token.csv.gz"])
def test_a_damaged_kept_file_is_named_and_only_its_run_set_aside(damaged, tmp_path, capsys):
    runs = [kept_run(tmp_path, name) for name in ("a-t2-s0", "a-t2-s1")]
    untouched = {path: path.read_bytes() for path in runs[1].rglob("*") if path.is_file()}
    path = runs[0] / damaged
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # cut short
    with pytest.raises(TwoTowerUserError) as raised:
        check_kept_run(runs[0])
    assert f"The kept results of run a-t2-s0 are damaged: {path} cannot be read" in str(raised.value)
    assert "--runs '^a-t2-s0$'" in str(raised.value)
    check_kept_run(runs[1])
    assert set_aside_if_damaged(runs[0], "[1/2]") and not set_aside_if_damaged(runs[1], "[2/2]")
    assert not runs[0].exists() and (tmp_path / ".a-t2-s0.damaged" / damaged).is_file()  # nothing lost
    assert f"a-t2-s0: its kept results are damaged ({path} cannot be read" in capsys.readouterr().out
    assert {path: path.read_bytes() for path in runs[1].rglob("*") if path.is_file()} == untouched


def test_a_finished_run_whose_run_json_was_cut_is_run_again(tmp_path, monkeypatch):
    run = type("Run", (), {"name": "a-t2-s0"})()
    run_dir = tmp_path / "out" / "runs" / run.name
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"run": {"name": "a-t2-')  # cut while written by an earlier version
    calls = []
    monkeypatch.setattr(study, "run_one", lambda *args: calls.append("run_one"))
    monkeypatch.setattr(study, "keep_run_results", lambda *args: calls.append("keep"))
    monkeypatch.setattr(study, "training_texts", lambda *args: {})
    study.finish_run(None, run, tmp_path, tmp_path / "out", tmp_path / "report" / "runs" / run.name, False, "[1/1]")
    assert calls == ["run_one", "keep"]
    with pytest.raises(TwoTowerUserError, match=f"{run_dir / 'run.json'} cannot be read .*: it is damaged or cut "
                                                r"short; run the study again with --runs '\^a-t2-s0\$'"):  # fmt: skip
        study.load_run_summary(run_dir / "run.json")


# 5. every regular expression from the command line, checked when parsed


def test_a_runs_pattern_that_is_not_a_regular_expression_is_refused_when_parsed(tmp_path, command, monkeypatch):
    monkeypatch.setattr(study, "run_study", lambda *args: pytest.fail("the study started"))
    status, stderr = command(study.main, ["--runs", "(", "--data_dir", tmp_path, "--output_dir", tmp_path / "out"])
    assert_one_error_line(status, stderr, "--runs '(' is not a regular expression (missing ), unterminated "
                                          "subpattern at position 0)", "e.g. --runs '^gpt-t2-s0$'")  # fmt: skip
    status, stderr = command(score.main, ["--model_dir", tmp_path, "--output_dir", tmp_path / "r",
                                          "--validation_file", tmp_path, "--document_pattern", "["])  # fmt: skip
    assert_one_error_line(status, stderr, "`document_pattern` '[' is not a regular expression")


# 6. --overwrite_output_dir over a link


def test_overwrite_output_dir_refuses_a_link_before_removing_anything(tmp_path):
    run, user = tmp_path / "run", tmp_path / "user"
    (run / "checkpoints" / "step_1").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "progress.json").write_text("{}")
    user.mkdir()
    (user / "thesis.tex").write_text("the user's")
    (run / "runs").symlink_to(user)
    with pytest.raises(TwoTowerUserError) as raised:
        prepare_new_run(run, overwrite_output_dir=True)
    assert str(raised.value).startswith(f"--overwrite_output_dir would remove {run / 'runs'}, but it is a symbolic "
                                        f"link (to {user}), whose files are not the run's to remove; nothing was "
                                        "removed.")  # fmt: skip
    assert (run / "checkpoints" / "step_1" / "progress.json").is_file() and (user / "thesis.tex").is_file()


# 7. MeanAblation given the features of other towers


def test_mean_ablation_names_features_of_other_towers():
    model = TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB_SIZE))
    ablation = MeanAblation(torch.zeros(2, 64), VOCAB_SIZE)
    targets = torch.tensor([1, 2, 3])
    with pytest.raises(ValueError, match=r"MeanAblation holds means of shape \[2, 64\] \(\[towers, hidden\]\) but was "
                                         r"given features of shape \[1, 3, 64\]"):  # fmt: skip
        ablation.update(model, torch.zeros(1, 3, 64), targets)
    with pytest.raises(ValueError, match=r"`scored_targets` has shape \[2\], the features hold 3 positions"):
        ablation.update(model, torch.zeros(2, 3, 64), targets[:2])
    with torch.inference_mode():  # as scoring runs it
        increases = ablation.update(model, torch.zeros(2, 3, 64), targets)
    assert increases.shape == (2, 3)


# 10. user data in Markdown: report.md, the model card and the study's names render inert


HOSTILE = '"><img src=x onerror="window.__ran=1">[a](javascript:window.__ran=2)`<script>window.__ran=3</script>|_*'


def rendered_in_chromium(chromium, markdown_text: str):
    """The Markdown rendered as MkDocs and the Hub render it (Python-Markdown, tables), opened in Chromium."""
    import markdown

    page = chromium.new_page()
    page.set_content(f"<html><body>{markdown.markdown(markdown_text, extensions=['tables'])}</body></html>")
    page.wait_for_timeout(200)  # an onerror handler would have run by now
    return page


def assert_inert(page):
    assert page.evaluate("window.__ran") is None  # no handler, script or link ran
    assert page.locator("img[src=x], script, a[href^=javascript]").count() == 0


def test_report_md_shows_hostile_names_as_written(chromium):
    from test_templates import two_tower_result

    from twotower.evaluation.scoring import report

    result = two_tower_result()
    metadata = {"model": {"path": f"/models/{HOSTILE}/model"},
                "data": {"description": f"local text {HOSTILE}.txt", "num_blocks": 3, "block_size": 32},
                "perplexity": {"joint": 12.0, "probes": [20.0, 21.5]}, "summary": result.summary}  # fmt: skip
    tokens = [f"{HOSTILE}{token_id}" for token_id in result.token_ids]
    page = rendered_in_chromium(chromium, report.render_markdown(metadata, report.per_token_table(result, tokens)))
    assert_inert(page)
    text = page.inner_text("body")
    assert f"Model: /models/{HOSTILE}/model (2 towers). Data: local text {HOSTILE}.txt, 3 blocks" in text
    page.close()


def test_the_model_card_shows_hostile_names_as_written(chromium):
    import jinja2

    from twotower.evaluation.publishing.model_card import CARD_FUNCTIONS, model_card_template, phase_config

    template = jinja2.Template(model_card_template().read_text(encoding="utf-8"))
    config = dict(phase="pretrain", train_file=f"/data/{HOSTILE}.txt", validation_file=f"{HOSTILE}.txt",
                  tokenizer_name_or_path=HOSTILE, block_size=8, tokenizer_vocab_size=300, max_train_steps=10,
                  per_device_train_batch_size=2, gradient_accumulation_steps=1, learning_rate=1e-3, adam_beta1=0.9,
                  adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.1, max_grad_norm=1.0, lr_scheduler_type="cosine",
                  num_warmup_steps=1, seed=1)  # fmt: skip
    card = template.render(phases=[phase_config(config)], family={"objective": "causal"}, model_name=HOSTILE,
                           architecture={"num_parameters": 0, "num_probe_parameters": 0}, hardware=HOSTILE,
                           **CARD_FUNCTIONS)  # fmt: skip
    page = rendered_in_chromium(chromium, card)
    assert_inert(page)
    text = page.inner_text("body")
    assert page.inner_text("h1") == HOSTILE and f"Hardware: {HOSTILE}." in text
    shown_paths = [phase_config(config)[key] for key in ("train_file", "validation_file", "tokenizer_name_or_path")]
    assert all(f"{path}" in text for path in shown_paths) and any("img" in path for path in shown_paths)
    page.close()


def test_study_recipe_names_are_plain_names(tmp_path):
    from twotower.evaluation.study.config import load_study_config

    recipe = yaml.safe_load((Path(study.__file__).parent / "recipes" / "cpu.yaml").read_text())
    recipe["families"] = {HOSTILE: recipe["families"]["causal"]}
    (tmp_path / "hostile.yaml").write_text(yaml.safe_dump(recipe))
    with pytest.raises(TwoTowerUserError, match=r"The study recipe's families has the name '\"><img src=x .*a name "
                                                r"is a folder name and a word of the results document"):  # fmt: skip
        load_study_config(str(tmp_path / "hostile.yaml"))


# 11. the Space serves models, not the file system


@pytest.fixture
def space_module(monkeypatch):
    """app.py's model_source, imported as the Space imports it (its folder on the path)."""
    monkeypatch.syspath_prepend(str(Path(score.__file__).parent.parent / "tower_preference"))
    import model_source

    return model_source


def test_a_hub_model_over_the_download_limit_is_refused_before_any_download(space_module, monkeypatch):
    files = [("config.json", 1_000), ("model.safetensors", 3_000_000_000), ("pytorch_model.bin", 9_000_000_000)]
    info = type("Info", (), {"sha": "abc", "siblings": [type("File", (), {"rfilename": name, "size": size})()
                                                        for name, size in files]})()  # fmt: skip
    asked, downloaded = [], []
    monkeypatch.setattr(space_module.HfApi, "model_info", lambda self, repo_id, **kwargs: asked.append(kwargs) or info)
    monkeypatch.setattr(space_module, "snapshot_download", lambda *args, **kwargs: downloaded.append(kwargs) or "/x")
    with pytest.raises(space_module.ModelSourceError, match=r"'owner/big' is 3.00 GB; this Space downloads at most "
                                                            r"2.00 GB"):  # fmt: skip
        space_module.served_model_path("owner/big")
    assert asked == [{"files_metadata": True}] and not downloaded
    monkeypatch.setenv(space_module.MAX_DOWNLOAD_VARIABLE, "4")  # --max_download_gb 4: the .bin is never fetched
    assert space_module.served_model_path(" owner/big ") == "/x"
    assert downloaded == [{"revision": "abc", "allow_patterns": ["*.json", "*.safetensors", "*.txt", "*.model"]}]


def test_the_space_opens_no_path_outside_its_model_directory(space_module, tmp_path, monkeypatch):
    models_dir = tmp_path / "models"
    (models_dir / "mine").mkdir(parents=True)
    (models_dir / "out").symlink_to("/etc")
    monkeypatch.setenv(space_module.MODEL_DIR_VARIABLE, str(models_dir))
    sent_to_hub = []
    monkeypatch.setattr(space_module, "download_hub_model", lambda name: sent_to_hub.append(name) or "/hub")
    assert space_module.served_model_path("mine") == str((models_dir / "mine").resolve())
    messages = set()
    for outside in ("/etc", "/etc/passwd", "/no/such/folder", "../../etc", "../models/../../etc", "mine/../../out"):
        with pytest.raises(space_module.ModelSourceError) as raised:
            space_module.served_model_path(outside)
        messages.add(str(raised.value))
    assert messages == {space_module.not_served_message()} and "/etc" not in space_module.not_served_message()
    # a link out of the model directory is not served; its name, shaped like a Hub id, goes to the Hub, never to disk
    assert [space_module.served_model_path(name) for name in ("out", "out/ssl")] == ["/hub", "/hub"]
    assert sent_to_hub == ["out", "out/ssl"]


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_space_in_a_browser_answers_alike_for_paths_that_exist_and_do_not(tmp_path, chromium, monkeypatch):
    import importlib.util

    metric_dir = Path(score.__file__).parent.parent / "tower_preference"
    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    monkeypatch.setenv("TOWER_PREFERENCE_MODEL_DIR", str(tmp_path))  # the Space's --model_dir
    monkeypatch.syspath_prepend(str(metric_dir))
    spec = importlib.util.spec_from_file_location("tower_preference_space_app_paths", metric_dir / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    port = free_port()
    app.demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        page = chromium.new_page()
        page.goto(f"http://127.0.0.1:{port}")
        page.get_by_role("tab", name="A model and a text").click()
        shown = {}
        for path in ("/etc", "/root", "/no/such/folder", "/etc/passwd"):
            page.get_by_label("model: a twotower model").fill(path)
            page.get_by_label("text: a short text to score").fill("a short text")
            page.locator("button:visible", has_text="Submit").click()
            toast = page.get_by_text("This Space serves Hub models").last
            toast.wait_for(timeout=30_000)
            shown[path] = toast.inner_text()
            page.reload()
            page.get_by_role("tab", name="A model and a text").click()
        assert len(set(shown.values())) == 1, shown
        assert next(iter(shown.values())).startswith("This Space serves Hub models and opens no other path")
        page.close()
    finally:
        app.demo.close()
