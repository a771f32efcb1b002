"""The study driver end to end on a micro grid: probe replicas, one scoring code path, resume, aggregation, errors."""

import dataclasses
import json
import shutil

import numpy as np
import pytest
import torch
import yaml
from scipy import stats
from torch.utils.data import DataLoader

from twotower.evaluation import study as study_module
from twotower.evaluation.report import eligible_preferences, load_report
from twotower.evaluation.score import ScoringArguments, load_blocks
from twotower.evaluation.study import SUMMARY_FIELDS, load_study_config, run_study
from twotower.evaluation.study_report import correlation_p_value
from twotower.evaluation.tower_preference.preference_stats import compare_preferences, compute_preference
from twotower.training.arguments import load_config
from twotower.training.data import collate_blocks
from twotower.training.loading import load_two_tower
from twotower.training.tokenizer import load_tokenizer


NUM_REPLICAS = 2
BOOKS_BLOCKS = 12
MICRO_STUDY = {
    "train_file": "wiki/train.txt",
    "validation_file": "wiki/valid.txt",
    "eval_texts": {"wiki-test": {"file": "wiki/test.txt"}, "books": {"file": "books", "max_blocks": BOOKS_BLOCKS}},
    "families": {
        "causal": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe"},
        "control": {"pretrain_recipe": "tiny_control", "probe_recipe": "tiny_control_probe", "control_of": "causal"},
    },
    "grid": [{"family": "causal", "seeds": [0, 1]}, {"family": "control", "seeds": [0]}],
    "pretrain": {
        "tokenizer_vocab_size": 512,
        "max_train_steps": 6,
        "num_warmup_steps": 1,
        "eval_steps": 6,
        "max_eval_blocks": 4,
        "checkpointing_steps": None,  # no step checkpoints: only at the end of an epoch
        "per_device_train_batch_size": 8,
    },
    "probe": {
        "probe_replicas": NUM_REPLICAS,
        "max_train_steps": 30,
        "num_warmup_steps": 1,
        "eval_steps": 3,
        "early_stopping_patience": 1,
        "max_eval_blocks": 4,
        "checkpointing_steps": None,  # no step checkpoints: only at the end of an epoch
        "per_device_train_batch_size": 8,
    },
    "scoring": {"batch_size": 8, "min_count": 5},
}


def write_lines(path, source, start, count):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[start : start + count]), encoding="utf-8")


def write_recipe(path, **changes):
    path.write_text(yaml.safe_dump({**MICRO_STUDY, **changes}))
    return str(path)


@pytest.fixture(scope="module")
def micro_study(tmp_path_factory, shared_data):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("study")
    data_dir = root / "data"
    wiki = shared_data / "wikitext-2"
    write_lines(data_dir / "wiki" / "train.txt", wiki / "train.txt", 0, 1500)
    write_lines(data_dir / "wiki" / "valid.txt", wiki / "valid.txt", 0, 150)
    write_lines(data_dir / "wiki" / "test.txt", wiki / "test.txt", 0, 150)
    for novel in ("pg11_alice_in_wonderland.txt", "pg35_the_time_machine.txt"):
        write_lines(data_dir / "books" / novel, shared_data / "gutenberg" / novel, 100, 200)
    recipe = write_recipe(root / "micro.yaml")
    output_dir = root / "out"
    report = run_study(recipe, data_dir, output_dir, command="micro study")
    return {"recipe": recipe, "data_dir": data_dir, "output_dir": output_dir, "report": report}


def markdown_rows(text):
    """The cells of every Markdown table row of a document, stripped (header rows included, separator rows not)."""
    return [
        [cell.strip() for cell in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|") and not set(line) <= set("|-: ")
    ]


def run_summary(micro_study, name):
    return json.loads((micro_study["output_dir"] / "runs" / name / "run.json").read_text())


def gold_logprobs_directly(model_dir, text_file, max_blocks=None):
    """(targets [n], log-probs [probes, n], tower-major) of every probe replica over a text, without the study or
    scoring code; max_blocks blocks evenly spaced over the text."""
    tokenizer = load_tokenizer(str(model_dir))
    args = ScoringArguments(model_dir=str(model_dir), output_dir="unused", validation_file=str(text_file))
    blocks = load_blocks(args, tokenizer)
    if max_blocks is not None:
        blocks = blocks.select(np.linspace(0, len(blocks) - 1, max_blocks).round().astype(int).tolist())
    model = load_two_tower(str(model_dir), torch.float32)
    targets, gold = [], []
    with torch.no_grad():
        for batch in DataLoader(blocks.with_format("torch"), batch_size=5, collate_fn=collate_blocks):
            targets.append(batch["input_ids"][:, 1:].flatten())
            gold.append(model.probe_logprobs(batch["input_ids"], all_replicas=True).flatten(0, 1).flatten(1))
    return torch.cat(targets).numpy(), torch.cat(gold, dim=1).numpy()


def test_run_figures_are_the_scoring_commands_and_match_an_independent_computation(micro_study):
    run_dir = micro_study["output_dir"] / "runs" / "causal-t2-s0"
    summary = run_summary(micro_study, "causal-t2-s0")
    for text in MICRO_STUDY["eval_texts"]:
        report = json.loads((run_dir / "scores" / text / "preference.json").read_text())
        figures = summary["scores"][text]
        assert {key: figures[key] for key in SUMMARY_FIELDS} == {key: report["summary"][key] for key in SUMMARY_FIELDS}
        assert figures["perplexity"] == report["perplexity"]
        assert report["settings"]["center"] and report["data"]["spread_blocks"]

    # the same figures from each replica's log-probs, paired by replica index, centered
    targets, gold = gold_logprobs_directly(run_dir / "probe" / "model", micro_study["data_dir"] / "books", BOOKS_BLOCKS)
    expected = compute_preference(
        targets,
        gold,
        min_count=5,
        center=True,
        probe_towers=[0] * NUM_REPLICAS + [1] * NUM_REPLICAS,
        probe_runs=list(range(NUM_REPLICAS)) * 2,
    ).summary
    figures = summary["scores"]["books"]
    for key in ("reliability", "reliability_single_probe", "significant_share", "occurrence_significant_share"):
        assert figures[key] == pytest.approx(expected[key], rel=1e-5, abs=1e-9), key
    for key in ("two_tower_difference_nats", "same_tower_floor_nats", "global_offset_nats"):
        np.testing.assert_allclose(figures[key], expected[key], rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(figures["reliability_ci"], expected["reliability_ci"], rtol=1e-5)
    assert figures["num_eligible_types"] == expected["num_eligible_types"] > 0
    assert figures["replicas_per_tower"] == [NUM_REPLICAS, NUM_REPLICAS] and figures["paired"]
    replica_perplexity = np.exp(-gold.astype(np.float64).mean(axis=1)).reshape(2, NUM_REPLICAS)
    np.testing.assert_allclose(figures["perplexity"]["probe_replicas"], replica_perplexity, rtol=1e-5)
    assert figures["num_blocks"] == BOOKS_BLOCKS


def test_one_probe_run_trains_distinct_replicas_and_stops_on_validation_loss(micro_study):
    run_dir = micro_study["output_dir"] / "runs" / "causal-t2-s0"
    assert sorted(path.name for path in run_dir.iterdir()) == ["pretrain", "probe", "run.json", "scores"]
    config = json.loads((run_dir / "probe" / "model" / "config.json").read_text())
    assert config["probe_replicas"] == NUM_REPLICAS
    probe = run_summary(micro_study, "causal-t2-s0")["probe"]
    assert probe["best_step"] % 3 == 0 and probe["best_step"] <= probe["completed_steps"] <= 30
    assert probe["stopped_early"] == (probe["completed_steps"] < 30)
    for replicas in run_summary(micro_study, "causal-t2-s0")["scores"]["wiki-test"]["perplexity"]["probe_replicas"]:
        assert replicas[0] != replicas[1]  # replicas start from other weights


def test_report_renders_the_replica_figures(micro_study):
    report_dir = micro_study["report"].parent
    text = micro_study["report"].read_text()
    study = json.loads((report_dir / "study.json").read_text())
    assert {row["run"] for row in study["runs"]} == {"causal-t2-s0", "causal-t2-s1", "control-t2-s0"}
    assert len(study["runs"]) == 6  # three runs x two texts
    for name in ("noise_floor.png", "cross_seed.png", "categories_causal-t2_books.png"):
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "micro study" in text and "**cooperation** (causal vs control, its independent-towers control)" in text
    assert "## Verdicts" in text and "## Runs" in text and "## Across seeds" in text and "## Token categories" in text

    (row,) = [r for r in study["runs"] if r["run"] == "causal-t2-s0" and r["text"] == "books"]
    figures = run_summary(micro_study, "causal-t2-s0")["scores"]["books"]
    assert row["reliability"] == figures["reliability"]
    assert [row["reliability_ci_low"], row["reliability_ci_high"]] == figures["reliability_ci"]
    assert row["excess_difference_nats"] == pytest.approx(
        figures["two_tower_difference_nats"] - figures["same_tower_floor_nats"]
    )
    (table_row,) = [cells for cells in markdown_rows(text) if cells[:2] == ["causal-t2-s0", "books"]]
    assert table_row[2] == f"{figures['perplexity']['joint']:.1f}"
    low, high = figures["reliability_ci"]
    assert table_row[6] == f"{figures['reliability']:.3f} ({low:.3f} to {high:.3f})"

    # the cross-seed correlation is compare_preferences over the two seeds' eligible replica-mean preferences
    (causal_books,) = [r for r in study["cross_seed"] if r["family"] == "causal" and r["text"] == "books"]
    runs_dir = micro_study["output_dir"] / "runs"
    tables = [load_report(runs_dir / f"causal-t2-s{seed}" / "scores" / "books")[1] for seed in (0, 1)]
    (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, tables)
    expected = compare_preferences(ids_a, preference_a, ids_b, preference_b)
    assert causal_books["correlation"] == pytest.approx(expected["correlation"])
    reliabilities = [r["reliability"] for r in study["runs"] if r["family"] == "causal" and r["text"] == "books"]
    assert causal_books["ceiling"] == pytest.approx(np.sqrt(np.prod(np.maximum(reliabilities, 0))))


def test_report_states_the_figures_of_its_runs(micro_study):
    text = micro_study["report"].read_text()
    lines = text.splitlines()
    study = json.loads((micro_study["report"].parent / "study.json").read_text())
    runs = study["runs"]

    # verdicts: each family's figures averaged over its run/text pairs, recomputed from study.json
    for family in ("causal", "control"):
        group = [row for row in runs if row["family"] == family]
        mean = {key: np.mean([row[key] for row in group]) for key in group[0] if isinstance(group[0][key], float)}
        low, high = min(row["reliability_ci_low"] for row in group), max(row["reliability_ci_high"] for row in group)
        above = sum(row["two_tower_difference_nats"] > row["same_tower_floor_nats"] for row in group)
        assert f"- **{family}** ({len(group)} run/text pairs, {NUM_REPLICAS} probe replicas per tower):" in lines
        assert (
            f"  - reliability {mean['reliability']:.3f} on average (95% intervals from {low:.3f} to {high:.3f}); "
            f"with one probe per tower {mean['reliability_single_probe']:.3f}."
        ) in lines
        assert (
            f"  - {100 * mean['significant_share']:.1f}% of eligible token types prefer one tower beyond probe noise "
            f"(replica-level test), against {100 * mean['occurrence_significant_share']:.1f}% by the occurrence-level "
            "test, which ignores probe noise."
        ) in lines
        assert (
            f"  - probes of two towers differ by {mean['two_tower_difference_nats']:.3f} nats per token type, probes "
            f"of one tower by {mean['same_tower_floor_nats']:.3f} (the noise floor): above the floor in {above} of "
            f"{len(group)} run/text pairs."
        ) in lines
    excess = {
        family: np.mean([row["excess_difference_nats"] for row in runs if row["family"] == family])
        for family in ("causal", "control")
    }
    assert f"two-tower difference above the floor by {excess['causal']:.3f} vs {excess['control']:.3f} nats." in text

    # across seeds: the verdict sentence and the table row of each (family, text)
    for row in study["cross_seed"]:
        figures = f"{row['correlation']:.3f} (largest p-value over seed pairs {max(row['p_values']):.2g}; ceiling "
        verdict = "**recurs**" if row["recurs"] else "**does not recur**"
        assert f"  - across 2 seeds on {row['text']} (2 towers): matched correlation {figures}" in text
        assert f"{row['ceiling']:.3f}): the split {verdict} across seeds" in text
        expected_cells = [row["family"], "2", row["text"], "2", f"{row['correlation']:.3f}"]
        expected_cells += [f"{max(row['p_values']):.2g}", f"{row['ceiling']:.3f}", "yes" if row["recurs"] else "no"]
        assert expected_cells in markdown_rows(text)

    # runs table: one row per run and text, with its figures
    table = markdown_rows(text)
    for row in runs:
        (cells,) = [cells for cells in table if cells[:2] == [row["run"], row["text"]]]
        assert cells[5] == f"{row['global_offset_nats']:.3f}"
        shares = ("reliability_single_probe", "significant_share", "occurrence_significant_share")
        differences = ("two_tower_difference_nats", "same_tower_floor_nats")
        assert cells[7:12] == [f"{row[key]:.3f}" for key in shares + differences]
        assert cells[12] == str(row["num_eligible_types"])

    # token categories: each seed's share of a category's types preferring the first seed's tower 0
    per_seed = study["categories"]["books"]["causal-t2"]
    for record in per_seed["causal-t2-s0"]["kind"]:
        shares = []
        for seed in ("causal-t2-s0", "causal-t2-s1"):
            (match,) = [r for r in per_seed[seed]["kind"] if r["category"] == record["category"]]
            share = match[f"num_preferring_tower{match['tower_of_reference_0']}"] / match["num_types"]
            shares.append(f"{share:.2f}" + ("*" if match["q_value"] < 0.05 else ""))
        assert ["kind", record["category"], str(record["num_types"]), *shares] in table


def test_finished_runs_are_not_repeated(micro_study, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("finished work was done again")

    monkeypatch.setattr(study_module, "training_function", fail)
    monkeypatch.setattr(study_module, "score_model", fail)
    before = (micro_study["report"].parent / "study.json").read_text()
    run_study(micro_study["recipe"], micro_study["data_dir"], micro_study["output_dir"], command="micro study")
    assert (micro_study["report"].parent / "study.json").read_text() == before


def test_an_interrupted_run_reuses_its_finished_phases_and_score_folders(micro_study, monkeypatch, tmp_path):
    name = "causal-t2-s0"
    run_dir = tmp_path / "out" / "runs" / name
    shutil.copytree(micro_study["output_dir"] / "runs" / name, run_dir)
    (run_dir / "run.json").unlink()
    shutil.rmtree(run_dir / "scores" / "books")

    def fail(*args, **kwargs):
        raise AssertionError("a finished phase was trained again")

    scored = []

    def score_model(model_dir, output_dir, **options):
        scored.append(output_dir.name)
        return real_score_model(model_dir, output_dir, **options)

    real_score_model = study_module.score_model
    monkeypatch.setattr(study_module, "training_function", fail)
    monkeypatch.setattr(study_module, "score_model", score_model)
    run_study(micro_study["recipe"], micro_study["data_dir"], tmp_path / "out", runs_pattern=f"^{name}$")
    assert scored == ["books"]
    before, after = run_summary(micro_study, name), json.loads((run_dir / "run.json").read_text())
    assert after["scores"]["wiki-test"]["seconds"] is None  # reused: its scoring time is not known
    for text in MICRO_STUDY["eval_texts"]:
        for figures in (before, after):
            figures["scores"][text].pop("seconds")
    assert after == before


def test_old_recipes_and_runs_get_clear_errors(micro_study, tmp_path):
    with pytest.raises(ValueError, match="`probe_seed_offset`, which the study no longer has"):
        load_study_config(write_recipe(tmp_path / "old.yaml", probe_seed_offset=1000))
    probe_options = {key: value for key, value in MICRO_STUDY["probe"].items() if key != "probe_replicas"}
    with pytest.raises(ValueError, match="probe_replicas=None"):
        load_study_config(write_recipe(tmp_path / "single.yaml", probe=probe_options))
    with pytest.raises(ValueError, match=r"sets \['center'\], which the study sets itself"):
        load_study_config(write_recipe(tmp_path / "center.yaml", scoring={"center": False}))
    with pytest.raises(ValueError, match=r"unknown options \['no_such_option'\]"):
        load_study_config(write_recipe(tmp_path / "unknown.yaml", scoring={"no_such_option": 1}))
    old_run = tmp_path / "out" / "runs" / "causal-t2-s0" / "run.json"
    old_run.parent.mkdir(parents=True)
    old_run.write_text(json.dumps({"run": {}, "pretrain": {}, "probes": [{}, {}], "scores": {}}))
    with pytest.raises(ValueError, match="earlier design"):
        run_study(micro_study["recipe"], micro_study["data_dir"], tmp_path / "out", aggregate_only=True)


def test_bad_study_options(micro_study, tmp_path):
    with pytest.raises(FileNotFoundError, match="known recipes"):
        load_study_config("no-such-study")
    with pytest.raises(ValueError, match="names family 'nope'"):
        load_study_config(write_recipe(tmp_path / "bad.yaml", grid=[{"family": "nope"}]))
    with pytest.raises(ValueError, match="selects none"):
        run_study(micro_study["recipe"], micro_study["data_dir"], tmp_path / "out", runs_pattern="^lstm")
    with pytest.raises(FileNotFoundError, match="--data_dir"):
        run_study(micro_study["recipe"], tmp_path / "missing", tmp_path / "out")


@pytest.mark.parametrize("recipe", ["cpu", "gpu"])
def test_shipped_study_recipes_load_with_valid_training_options(recipe):
    study = load_study_config(recipe)
    assert study.probe["probe_replicas"] >= 4
    for family in study.families.values():
        pretrain_options = {**study.pretrain, **family.overrides}
        dataclasses.replace(load_config(family.pretrain_recipe), **pretrain_options)
        probe = dataclasses.replace(load_config(family.probe_recipe), **study.probe)
        assert probe.phase == "probe" and probe.probe_replicas == study.probe["probe_replicas"]
    if recipe == "cpu":
        assert [run.name for run in study.runs()][:3] == ["causal-t2-s0", "causal-t2-s1", "causal-t2-s2"]
    assert study.families["control"].control_of == "causal"


def test_correlation_p_value_is_pearsons():
    generator = np.random.default_rng(0)
    x = generator.normal(size=60)
    for y in (generator.normal(size=60), x + generator.normal(size=60), -x + generator.normal(size=60)):
        result = stats.pearsonr(x, y)
        assert correlation_p_value(result.statistic, 60) == pytest.approx(result.pvalue, rel=1e-9)
