"""The study driver end to end on a micro grid: probe replicas, one scoring code path, resume, aggregation, errors."""

import dataclasses
import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from safetensors.torch import load_file
from scipy import stats
from torch.utils.data import DataLoader

from twotower.evaluation.study import driver as study_module
from twotower.evaluation.scoring.report import eligible_preferences, load_report
from twotower.evaluation.scoring.score import ScoringArguments, load_blocks
from twotower.evaluation.scoring.type_sums import read_type_sums
from twotower.evaluation.study.driver import SUMMARY_FIELDS, run_study
from twotower.evaluation.study.config import load_study_config
from twotower.evaluation.study.cross_fit import cross_fit_conclusion
from twotower.evaluation.study.categories import category_recurrence
from twotower.evaluation.study.document import compute_minutes, run_rows
from twotower.evaluation.study.kept_tables import kept_tokenizer_file, load_kept_report
from twotower.evaluation.tower_preference.comparisons import compare_preferences
from twotower.evaluation.tower_preference.replica_preference import compute_preference
from twotower.training.arguments import load_config
from twotower.training.data.blocks import collate_blocks
from twotower.training.loading import load_two_tower, read_training_config
from twotower.training.run.run_folder import checkpoints_written, read_eval_history
from twotower.training.data.tokenizer import load_tokenizer
from test_type_sums import VARIANCE_COLUMNS, table_from_float32_sums

pytestmark = pytest.mark.slow  # launches processes or trains several models: `-m "not slow"` skips it


NUM_REPLICAS = 2
KEPT_TOLERANCE = 1e-5  # figures of the kept float32 sums against the scoring's (evaluation/scoring/type_sums.py)
BOOKS_BLOCKS = 12  # of the causal family's 128 tokens
CONTROL_BLOCK_SIZE = 64  # the control pretrains, probes and scores on shorter blocks
MICRO_STUDY = {
    "train_file": "wiki/train.txt",
    "validation_file": "wiki/valid.txt",
    "eval_texts": {
        "wiki-test": {"file": "wiki/test.txt"},
        "books": {"file": "books", "max_tokens": BOOKS_BLOCKS * 128},
    },
    "families": {
        "causal": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe"},
        "control": {
            "pretrain_recipe": "tiny_control",
            "probe_recipe": "tiny_control_probe",
            "control_of": "causal",
            "overrides": {"block_size": CONTROL_BLOCK_SIZE, "max_position_embeddings": CONTROL_BLOCK_SIZE},
            "probe_overrides": {"block_size": CONTROL_BLOCK_SIZE},
        },
    },
    "grid": [{"family": "causal", "seeds": [0, 1]}, {"family": "control", "seeds": [0]}],
    "trajectory": [0.5, 1.0],
    "convergence_factor": 2,
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
        "probe_replica_data": "disjoint",  # cross-fitted: each replica on its own half of the training blocks
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


def scoring_table_from_float32_sums(score_dir):
    """
    The per-token table of a scoring command's report folder recomputed from its own sums rounded to float32, as a
    study keeps them (test_type_sums.table_from_float32_sums), by token id: what a kept table's figures that read a
    variance must give back. Against the scoring's float64 figures the replica-level test moves by more than the
    rounding: with the micro study's 2 runs (1 residual degree of freedom), a type whose replicas agree to 2e-5 nats
    has a variance of 4e-10 that float32 sums move by 2%, and the prior fitted to all types' log variances, which
    every type's standard error shares, moves with it (its variance by 8e-4 on a 2-core Intel Xeon; the study's runs,
    with 3 degrees of freedom: within 1e-5).
    """
    report, _ = load_report(score_dir)
    sums = read_type_sums(Path(score_dir) / "type_sums.parquet")
    no_tokens = lambda ids: [""] * len(ids)  # noqa: E731 (the figures are compared, not the token strings)
    return table_from_float32_sums(sums, report, no_tokens).set_index("token_id")


def run_summary(micro_study, name):
    return json.loads((micro_study["output_dir"] / "runs" / name / "run.json").read_text())


def gold_logprobs_directly(model_dir, text_file, max_blocks=None):
    """(targets [n], log-probs [probes, n], tower-major) of every probe replica over a text, without the study or
    scoring code; max_blocks blocks evenly spaced over the text."""
    tokenizer = load_tokenizer(str(model_dir))
    args = ScoringArguments(model_dir=str(model_dir), output_dir="unused", validation_file=str(text_file))
    blocks, _ = load_blocks(args, tokenizer)  # and the count of the text's tokens in no block
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


def test_a_family_on_shorter_blocks_probes_and_scores_the_same_text_on_its_own_blocks(micro_study):
    run_dir = micro_study["output_dir"] / "runs" / "control-t2-s0"
    for phase in ("pretrain", "probe"):
        assert read_training_config(run_dir / phase / "model")["block_size"] == CONTROL_BLOCK_SIZE
    books = run_summary(micro_study, "control-t2-s0")["scores"]["books"]
    assert books["num_blocks"] == BOOKS_BLOCKS * 128 // CONTROL_BLOCK_SIZE
    assert books["num_predictions"] == pytest.approx(
        run_summary(micro_study, "causal-t2-s0")["scores"]["books"]["num_predictions"], rel=0.05)


def test_one_probe_run_trains_distinct_replicas_and_stops_on_validation_loss(micro_study):
    run_dir = micro_study["output_dir"] / "runs" / "causal-t2-s0"
    assert sorted(path.name for path in run_dir.iterdir()) == ["pretrain", "probe", "run.json", "scores", "trajectory"]
    config = json.loads((run_dir / "probe" / "model" / "config.json").read_text())
    assert config["probe_replicas"] == NUM_REPLICAS
    probe = run_summary(micro_study, "causal-t2-s0")["probe"]
    assert probe["best_step"] % 3 == 0 and probe["best_step"] <= probe["completed_steps"] <= 30
    assert probe["stopped_early"] == (probe["completed_steps"] < 30)
    for replicas in run_summary(micro_study, "causal-t2-s0")["scores"]["wiki-test"]["perplexity"]["probe_replicas"]:
        assert replicas[0] != replicas[1]  # replicas start from other weights


PRIMARY_TEXT = "books"  # the first evaluation text, in the order of the recipe file (yaml.safe_dump sorts keys)


def test_verdicts_are_the_scoring_commands_figures_with_intervals(micro_study):
    text = micro_study["report"].read_text()
    study = json.loads((micro_study["report"].parent / "study.json").read_text())
    verdict = study["verdicts"]["causal"]
    assert set(study["verdicts"]) == {"causal"} and verdict["control"] == "control"
    assert {"reliability", "reliability_ci", "control_reliability", "control_reliability_ci", "difference_ci",
            "preference_over_floor", "cross_seed_r", "cross_seed_null_r", "seeds", "replicas",
            "joint_perplexity", "unigram_entropy_nats"} <= set(verdict)
    assert verdict["seeds"] == [0, 1] and verdict["control_seeds"] == [0] and verdict["replicas"] == NUM_REPLICAS

    # reliability: the mean of the scoring command's per-run figures (the replica-level variance recomputed from each
    # kept run's per-type sums, float32: KEPT_TOLERANCE); the floor: the mean of each run's two-tower difference minus
    # its same-tower floor
    causal = [run_summary(micro_study, f"causal-t2-s{seed}")["scores"][PRIMARY_TEXT] for seed in (0, 1)]
    control = run_summary(micro_study, "control-t2-s0")["scores"][PRIMARY_TEXT]
    assert verdict["reliability"] == pytest.approx(np.mean([run["reliability"] for run in causal]), rel=KEPT_TOLERANCE)
    assert verdict["control_reliability"] == pytest.approx(control["reliability"], rel=KEPT_TOLERANCE)
    assert verdict["difference"] == pytest.approx(verdict["reliability"] - verdict["control_reliability"])
    over_floor = [run["two_tower_difference_nats"] - run["same_tower_floor_nats"] for run in causal]
    assert verdict["preference_over_floor"] == pytest.approx(np.mean(over_floor), rel=1e-6)
    assert verdict["joint_perplexity"] == pytest.approx(np.mean([run["perplexity"]["joint"] for run in causal]))
    for key in ("reliability", "control_reliability", "difference", "preference_over_floor", "cross_seed_r"):
        low, high = verdict[f"{key}_ci"]
        assert low < high, key

    # cross-seed: compare_preferences over the two seeds' eligible replica-mean preferences
    runs_dir = micro_study["output_dir"] / "runs"
    tables = [load_report(runs_dir / f"causal-t2-s{seed}" / "scores" / PRIMARY_TEXT)[1] for seed in (0, 1)]
    (ids_a, preference_a, _), (ids_b, preference_b, _) = map(eligible_preferences, tables)
    expected = compare_preferences(ids_a, preference_a, ids_b, preference_b)
    assert verdict["cross_seed_r"] == pytest.approx(expected["correlation"], rel=KEPT_TOLERANCE)
    assert 0 < verdict["cross_seed_null_r"] < verdict["cross_seed_null_r_95"]

    # the document states each verdict with its interval, in one sentence and in the table
    low, high = verdict["reliability_ci"]
    assert f"{verdict['reliability']:.3f} [{low:.3f}, {high:.3f}]" in text
    verdicts_section = text.split("## Verdicts (")[1]
    (row,) = [cells for cells in markdown_rows(verdicts_section) if cells[0] == "causal" and cells[1] == "2"][:1]
    assert row[-1] == verdict["conclusion"]
    assert set(study["verdicts_by_text"]) == {"books", "wiki-test"}
    for heading in ("## Verdicts (books, end of training)", "## Convergence", "## Trajectory", "## Runs",
                    "## What the towers take (books)"):
        assert heading in text


def test_cross_fitted_verdicts_average_each_runs_report_over_seeds(micro_study):
    text = micro_study["report"].read_text()
    study = json.loads((micro_study["report"].parent / "study.json").read_text())
    verdict = study["cross_fit_verdicts"]["causal"]
    runs_dir = micro_study["output_dir"] / "runs"
    reports = {name: json.loads((runs_dir / name / "scores" / PRIMARY_TEXT / "preference.json").read_text())
               for name in ("causal-t2-s0", "causal-t2-s1", "control-t2-s0")}  # fmt: skip
    assert all(report["cross_fit"]["probe_replica_data"] == "disjoint" for report in reports.values())

    # the cooperative arm: the mean of its seeds' cross-fitted r, with a t interval on 1 degree of freedom
    per_seed = [reports[f"causal-t2-s{seed}"]["cross_fit"]["cross_fitted_r"] for seed in (0, 1)]
    cooperative = verdict["cooperative"]["cross_fitted_r"]
    assert cooperative["per_seed"] == per_seed and cooperative["value"] == pytest.approx(np.mean(per_seed))
    low, high = stats.t.interval(0.95, 1, loc=np.mean(per_seed), scale=stats.sem(per_seed))
    assert cooperative["ci"] == pytest.approx([low, high])
    control = verdict["control"]["cross_fitted_r"]
    assert control["value"] == reports["control-t2-s0"]["cross_fit"]["cross_fitted_r"] and control["ci"] is None
    # paired by seed: only seed 0 has both arms, too few for an interval, and the verdict says so
    difference = verdict["difference"]
    assert difference["seeds"] == [0] and difference["ci"] is None
    assert difference["value"] == pytest.approx(per_seed[0] - control["value"])
    expected_words = "no reproducible preference" if low <= 0 else "too few paired seeds for an interval"
    assert verdict["conclusion"] == expected_words

    # the ablation agreement of one run: Pearson's r of its per-token table's two preferences
    _, table = load_report(runs_dir / "causal-t2-s0" / "scores" / PRIMARY_TEXT)
    eligible = table[table["eligible"]]
    expected = np.corrcoef(eligible["preference_nats_tower0"], eligible["ablation_preference_nats_tower0"])[0, 1]
    first = verdict["cooperative"]["ablation_r"]["per_seed"][0]
    assert first["r"] == pytest.approx(expected, rel=KEPT_TOLERANCE) and first["ci"][0] < first["r"] < first["ci"][1]
    # the control's one seed: its agreement carries that run's interval over types, and the document says so
    control_ablation = verdict["control"]["ablation_r"]
    assert control_ablation["ci"] == control_ablation["per_seed"][0]["ci"] and control_ablation["over"] == "types"
    low_types, high_types = control_ablation["ci"]
    assert f"(control {control_ablation['value']:.2f} [{low_types:.2f}, {high_types:.2f}] (1 seed, over types))" in text

    assert "## Cross-fitted verdicts" in text and "In short, cross-fitted" in text
    assert f"*{expected_words}*; cross-fitted r {cooperative['value']:.2f} [{low:.2f}, {high:.2f}]" in text


@pytest.mark.parametrize("cooperative, control, difference, words", [
    ([0.1, 0.5], [-0.1, 0.08], [0.1, 0.5], "emerges from cooperation"),
    ([0.4, 0.6], [0.2, 0.4], [0.1, 0.3], "cooperative towers differ more reproducibly than independent ones"),
    ([0.4, 0.6], [0.4, 0.6], [-0.1, 0.1], "no difference shown between cooperative and independent towers"),
    ([0.2, 0.4], [0.5, 0.7], [-0.4, -0.2], "independent towers differ more reproducibly than cooperative ones"),
    ([-0.1, 0.3], [0.0, 0.1], [-0.1, 0.3], "no reproducible preference"),
    ([0.4, 0.6], None, None, "reproducible preference (no control)"),
])  # fmt: skip
def test_cross_fitted_words_say_what_the_intervals_show(cooperative, control, difference, words):
    def arm(ci):
        return None if ci is None else {"cross_fitted_r": {"value": sum(ci) / 2, "ci": ci}}

    verdict = {"cooperative": arm(cooperative), "control": arm(control),
               "difference": None if difference is None else {"value": sum(difference) / 2, "ci": difference}}
    assert cross_fit_conclusion(verdict) == words


def test_compute_time_counts_each_run_once_over_its_texts(micro_study):
    names = ["causal-t2-s0", "causal-t2-s1", "control-t2-s0"]
    summaries = [run_summary(micro_study, name) for name in names]
    assert len(run_rows(summaries)) == 2 * len(names)  # the report's tables: one row per run and text
    # every phase's seconds, added here from run.json
    seconds = []
    for summary in summaries:
        phases = [summary["pretrain"]] + [phase for point in summary["trajectory"]
                                          for phase in (point["probe"], *point["scores"].values())]
        seconds.append(sum(phase["seconds"] for phase in phases))
    total, longest = compute_minutes(summaries)
    assert total == pytest.approx(sum(seconds) / 60) and longest == pytest.approx(max(seconds) / 60)
    summaries[2]["pretrain"]["seconds"] = None  # a phase reused from an interrupted run: its time is not known
    assert compute_minutes(summaries)[0] == pytest.approx(sum(seconds[:2]) / 60)
    assert compute_minutes([]) == (None, None)


@pytest.mark.parametrize("steps_per_epoch", [1492, 1170, 7, 1])
def test_long_run_keeps_every_trajectory_checkpoint(steps_per_epoch):
    # the long recipe: 8 step checkpoints (steps 1,000 to 8,000) beside one per epoch end; the rotation removes the
    # oldest first, so a limit below what the run writes loses step 1,000, the trajectory's first point
    study = load_study_config("long")
    options = study_module.pretrain_options(study, study.runs()[0], {})
    written = checkpoints_written(0, options["max_train_steps"], options["checkpointing_steps"], steps_per_epoch, True)
    assert options["checkpointing_steps"] == 1000 and written >= 8
    assert options["checkpoints_total_limit"] >= written


def test_trajectory_models_hold_the_checkpoint_weights(micro_study):
    run_dir = micro_study["output_dir"] / "runs" / "causal-t2-s0"
    summary = run_summary(micro_study, "causal-t2-s0")
    assert [point["step"] for point in summary["trajectory"]] == [3, 6]
    assert [point["pretrain_validation"]["step"] for point in summary["trajectory"]] == [3, 6]
    assert list(summary["trajectory"][0]["scores"]) == [PRIMARY_TEXT]  # earlier steps: the first text only
    assert summary["trajectory"][-1]["scores"] == summary["scores"]
    exported = load_file(run_dir / "trajectory" / "step-3" / "model" / "model.safetensors")
    checkpoint = load_file(run_dir / "pretrain" / "checkpoints" / "step_3" / "model.safetensors")
    final = load_file(run_dir / "pretrain" / "model" / "model.safetensors")
    shared = set(exported) & set(checkpoint)
    assert len(shared) >= len(checkpoint) - 1  # one of the tied embedding / decoder pair may be stored once
    assert all(torch.equal(exported[name], checkpoint[name]) for name in shared)
    assert not all(torch.equal(final[name], checkpoint[name]) for name in shared)
    trained_on = json.loads((run_dir / "trajectory" / "step-3" / "probe" / "train_result.json").read_text())
    assert trained_on["completed_steps"] > 0

    study = json.loads((micro_study["report"].parent / "study.json").read_text())
    rows = [row for row in study["trajectory"] if row["run"] == "causal-t2-s0"]
    assert [row["step"] for row in rows] == [3, 6]
    assert rows[0]["reliability"] == summary["trajectory"][0]["scores"][PRIMARY_TEXT]["reliability"]
    assert rows[0]["validation_loss"] == summary["trajectory"][0]["pretrain_validation"]["loss"]


def test_convergence_run_is_twice_as_long_and_compared_at_both_ends(micro_study):
    study = json.loads((micro_study["report"].parent / "study.json").read_text())
    (check,) = study["convergence"]
    assert (check["family"], check["seed"], check["length"], check["long_length"]) == ("causal", 0, 6, 12)
    long_history = read_eval_history(micro_study["output_dir"] / "convergence" / "causal-t2-s0" / "pretrain")
    assert check["long_loss"] == long_history[-1]["loss"] and long_history[-1]["step"] == 12
    assert check["loss"] == run_summary(micro_study, "causal-t2-s0")["pretrain"]["eval_history"][-1]["loss"]
    assert check["relative_gap"] == pytest.approx((check["loss"] - check["long_loss"]) / check["long_loss"])


def test_a_category_recurs_when_its_types_lean_to_the_same_matched_tower_in_two_seeds():
    def seed(reference_tower, frequent_preferring, other_preferring, frequent_mean):
        # preferring counts are of the tower matched to the first seed's tower 0; the frequent types' mean preference
        # for it has the sign of `frequent_mean` whichever way their counts lean
        other_tower = 1 - reference_tower
        rows = [("frequent", 100, frequent_preferring, frequent_mean), ("other", 900, other_preferring, 0.01)]
        return {"frequency": pd.DataFrame([{
            "category": category, "num_types": types, f"num_preferring_tower{reference_tower}": preferring,
            f"num_preferring_tower{other_tower}": types - preferring, f"mean_preference_tower{reference_tower}": mean,
            f"mean_preference_tower{other_tower}": -mean, "q_value": 0.001, "tower_of_reference_0": reference_tower,
        } for category, types, preferring, mean in rows])}

    # 60 and 55 of the 100 frequent types prefer the matched tower, against 24% and 20.5% of all types
    by_family = {("masked", 2): {"s0": seed(0, 60, 180, -0.01), "s1": seed(1, 55, 150, 0.02)}}
    rows = {row["category"]: row["masked"] for row in category_recurrence(by_family, groupings=("frequency",))}
    assert rows["frequent"] == {"significant_seeds": 2, "seeds": 2, "same_side": True, "recurs": True}
    assert rows["other"]["recurs"]
    opposite = {("masked", 2): {"s0": seed(0, 60, 180, 0.01), "s1": seed(1, 10, 250, 0.02)}}
    rows = {row["category"]: row["masked"] for row in category_recurrence(opposite, groupings=("frequency",))}
    assert not rows["frequent"]["same_side"] and not rows["frequent"]["recurs"]


def test_token_categories_of_every_seed(micro_study):
    text = micro_study["report"].read_text()
    study = json.loads((micro_study["report"].parent / "study.json").read_text())
    table = markdown_rows(text)
    # each seed's share of a category's types preferring the first seed's tower 0
    per_seed = study["categories"]["causal-t2"]
    for record in per_seed["causal-t2-s0"]["kind"]:
        shares = []
        for seed in ("causal-t2-s0", "causal-t2-s1"):
            (match,) = [r for r in per_seed[seed]["kind"] if r["category"] == record["category"]]
            share = match[f"num_preferring_tower{match['tower_of_reference_0']}"] / match["num_types"]
            shares.append(f"{share:.2f}" + ("*" if match["q_value"] < 0.05 else ""))
        assert ["kind", record["category"], str(record["num_types"]), *shares] in table
    assert {row["grouping"] for row in study["category_recurrence"]} == {"kind", "frequency", "case"}
    top = study["top_types"]["causal"]
    assert top["run"] == "causal-t2-s0" and all(len(tower) <= 20 for tower in top["towers"])
    scores = micro_study["output_dir"] / "runs" / "causal-t2-s0" / "scores"
    first = scoring_table_from_float32_sums(scores / PRIMARY_TEXT)
    eligible = first[first["eligible"] & (first["preferred_tower"] == 0)]
    assert top["towers"][0][0]["p_value"] == pytest.approx(eligible["p_value"].min(), rel=1e-9)


def test_finished_runs_are_not_repeated(micro_study, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("finished work was done again")

    monkeypatch.setattr(study_module, "training_function", fail)
    monkeypatch.setattr(study_module, "score_model", fail)
    before = (micro_study["report"].parent / "study.json").read_text()
    run_study(micro_study["recipe"], micro_study["data_dir"], micro_study["output_dir"], command="micro study")
    assert (micro_study["report"].parent / "study.json").read_text() == before


def test_the_report_folder_alone_redoes_the_document_and_continues_the_study(micro_study, monkeypatch, tmp_path):
    """A fresh clone holds the committed report folder, not OUTPUT_DIR: nothing finished is redone from it."""
    def fail(*args, **kwargs):
        raise AssertionError("finished work was done again")

    report_dir = tmp_path / "report"
    shutil.copytree(micro_study["report"].parent, report_dir)
    monkeypatch.setattr(study_module, "training_function", fail)
    monkeypatch.setattr(study_module, "score_model", fail)
    run_study(micro_study["recipe"], micro_study["data_dir"], tmp_path / "empty", report_dir, command="micro study")
    for name in ("study.json", "STUDY.md"):
        assert (report_dir / name).read_text() == (micro_study["report"].parent / name).read_text()
    assert not (tmp_path / "empty").exists()

    kept = json.loads((report_dir / "runs" / "causal-t2-s0" / "run.json").read_text())
    assert kept["model"] == {"objective": "causal", "tower_type": "transformer"}
    assert kept["kept_tokenizer"].startswith("tokenizers/")  # the report folder's copy of the run's tokenizer
    added = ("model", "unigram_cross_entropy_nats", "kept_tokenizer")
    assert {key: value for key, value in kept.items() if key not in added} == run_summary(micro_study, "causal-t2-s0")
    verdict = json.loads((report_dir / "study.json").read_text())["verdicts"]["causal"]
    assert verdict["unigram_entropy_nats"] == kept["unigram_cross_entropy_nats"] > 0
    for text in MICRO_STUDY["eval_texts"]:
        source, copy = (folder / "scores" / text for folder in (micro_study["output_dir"] / "runs" / "causal-t2-s0",
                                                                  report_dir / "runs" / "causal-t2-s0"))
        assert sorted(path.name for path in copy.iterdir()) == ["preference.json", "type_sums.parquet"]
        assert (copy / "preference.json").read_bytes() == (source / "preference.json").read_bytes()
        # the kept sums give back the scoring command's per-token table, on the eligible types (float32 sums)
        kept_table = load_kept_report(copy).table
        written = load_report(source)[1].set_index("token_id").loc[kept_table["token_id"]].reset_index()
        assert written["eligible"].all() and len(kept_table) == int(load_report(source)[1]["eligible"].sum())
        rounded = scoring_table_from_float32_sums(source).loc[kept_table["token_id"]].reset_index()
        for column in kept_table.columns:
            reads_variance = column.startswith(VARIANCE_COLUMNS)
            expected = (rounded if reads_variance else written)[column].to_numpy()
            if kept_table[column].dtype.kind == "f":
                tolerance = 1e-9 if reads_variance else KEPT_TOLERANCE
                np.testing.assert_allclose(kept_table[column], expected, rtol=tolerance, atol=tolerance, err_msg=column)
            else:
                assert (kept_table[column].to_numpy() == expected).all(), column
    long_run = json.loads((report_dir / "convergence" / "causal-t2-s0.json").read_text())
    assert long_run["eval_history"] == read_eval_history(micro_study["output_dir"] / "convergence" / "causal-t2-s0"
                                                         / "pretrain")

    # a run finished in OUTPUT_DIR whose results the report folder lacks: kept again, identical, nothing rerun
    shutil.rmtree(report_dir / "runs" / "control-t2-s0")
    (report_dir / "convergence" / "causal-t2-s0.json").unlink()
    run_study(micro_study["recipe"], micro_study["data_dir"], micro_study["output_dir"], report_dir,
              aggregate_only=True, command="micro study")
    assert (report_dir / "study.json").read_text() == (micro_study["report"].parent / "study.json").read_text()

    # a family whose kept runs are gone leaves the document, and its plot the folder; other files stay
    assert (report_dir / "categories_control.png").is_file()
    (report_dir / "my_notes.png").write_bytes(b"mine")
    shutil.rmtree(report_dir / "runs" / "control-t2-s0")
    run_study(micro_study["recipe"], micro_study["data_dir"], tmp_path / "empty", report_dir, aggregate_only=True,
              command="micro study")
    assert json.loads((report_dir / "study.json").read_text())["verdicts"]["causal"]["control_reliability"] is None
    assert not (report_dir / "categories_control.png").exists() and (report_dir / "categories_causal.png").is_file()
    assert (report_dir / "my_notes.png").read_bytes() == b"mine"


def test_an_interrupted_run_reuses_its_finished_phases_and_score_folders(micro_study, monkeypatch, tmp_path):
    name = "causal-t2-s0"
    run_dir = tmp_path / "out" / "runs" / name
    shutil.copytree(micro_study["output_dir"] / "runs" / name, run_dir)
    shutil.copytree(micro_study["output_dir"] / "convergence", tmp_path / "out" / "convergence")  # finished too
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
    for figures in (before, after):
        for point in (figures, *figures["trajectory"]):
            for scores in point["scores"].values():
                scores.pop("seconds")
    assert after == before


def test_old_recipes_and_runs_get_clear_errors(micro_study, tmp_path):
    with pytest.raises(ValueError, match="`probe_seed_offset`, which the study no longer has"):
        load_study_config(write_recipe(tmp_path / "old.yaml", probe_seed_offset=1000))
    old_texts = {"books": {"file": "books", "max_blocks": 12}}
    with pytest.raises(ValueError, match="eval_texts.books sets max_blocks=12; set max_tokens instead"):
        load_study_config(write_recipe(tmp_path / "blocks.yaml", eval_texts=old_texts))
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


@pytest.mark.parametrize("recipe", ["cpu", "gpu", "crossfit", "long"])
def test_shipped_study_recipes_load_with_valid_training_options(recipe):
    study = load_study_config(recipe)
    assert study.probe["probe_replicas"] >= 4
    for family in study.families.values():
        pretrain_options = {**study.pretrain, **family.overrides}
        dataclasses.replace(load_config(family.pretrain_recipe), **pretrain_options)
        probe = dataclasses.replace(load_config(family.probe_recipe), **{**study.probe, **family.probe_overrides})
        assert probe.phase == "probe" and probe.probe_replicas == study.probe["probe_replicas"]
    if recipe == "cpu":  # family by family, each cooperative family with its control, seed-major
        assert [run.name for run in study.runs()][:3] == ["causal-t2-s0", "causal_control-t2-s0", "causal-t2-s1"]
        assert {name: family.control_of for name, family in study.families.items() if family.control_of} == {
            "causal_control": "causal", "elmo_control": "elmo", "masked_control": "masked"}
        assert len(study.runs()) == 18 and study.convergence_factor == 2


def cross_fitted_r_from_sums(table, replicas_per_tower, num_towers, min_count):
    """The cross-fitted r recomputed from a kept type_sums.parquet with plain numpy (no import of the package)."""
    table = table.astype({column: float for column in table if column.startswith("logprob_sum_probe")})
    halves = [table[table["half"] == half].set_index("token_id") for half in (0, 1)]
    types = np.intersect1d(*(half.index[half["count"] >= min_count] for half in halves))
    split = replicas_per_tower // 2
    groups = [list(range(split)), list(range(split, replicas_per_tower))]

    def preference(half, group):
        sums = np.stack([half.loc[types, f"logprob_sum_probe{t * replicas_per_tower + r}"].to_numpy()
                         for t in range(num_towers) for r in group]).reshape(num_towers, len(group), -1)
        means = (sums.mean(axis=1) / half.loc[types, "count"].to_numpy()).T  # [types, towers]
        means = means - means.mean(axis=0)
        return (means - means.mean(axis=1, keepdims=True)).ravel()

    (a1, a2), (b1, b2) = ([preference(half, group) for half in halves] for group in groups)
    return float(np.mean([np.corrcoef(a1, b2)[0, 1], np.corrcoef(b1, a2)[0, 1]]))


def test_kept_type_sums_recompute_each_points_cross_fitted_r(micro_study):
    kept = micro_study["report"].parent / "runs" / "causal-t2-s0"
    summary = json.loads((kept / "run.json").read_text())
    points = {"": summary["scores"], "trajectory/step-3/": summary["trajectory"][0]["scores"]}
    for point, scores in points.items():
        for text, figures in scores.items():
            path = kept / f"{point}scores" / text / "type_sums.parquet"
            table = pd.read_parquet(path)
            # the types seen min_count times; the totals over every type in the file's metadata
            min_count = figures["cross_fit"]["min_count"]
            assert (table.groupby("token_id")["count"].sum() >= min_count).all()
            totals = json.loads(pq.read_schema(path).metadata[b"twotower.type_sums"])["totals"]
            assert totals["count"] == figures["cross_fit"]["num_predictions"]
            recomputed = cross_fitted_r_from_sums(table, NUM_REPLICAS, 2, min_count)
            # float32 sums: a cross-fitted r within 2e-7 of the scoring's
            assert recomputed == pytest.approx(figures["cross_fit"]["cross_fitted_r"], abs=1e-6)
            if point:  # an earlier point keeps what its cross-fitted figures read
                assert not any(column.startswith(("ablation", "preference_sq")) for column in table)
                continue
            # the last point's ablation sums add up to each tower's mean increase over every scored position
            increases = np.sum([totals[f"ablation_increase_sum_tower{tower}"] for tower in (0, 1)], axis=1)
            increases = increases / np.sum(totals["count"])
            assert increases.tolist() == pytest.approx(figures["ablation"]["mean_increase_nats"], rel=1e-6)
    # each run's tokenizer, kept once per report folder under its sha256 and named by the run.json of every run
    # that has it; no run keeps a copy of its own
    report_dir, tokenizers = micro_study["report"].parent, set()
    for run_dir in sorted((report_dir / "runs").iterdir()):
        written = (micro_study["output_dir"] / "runs" / run_dir.name / "pretrain" / "model" / "tokenizer.json")
        tokenizer_file = kept_tokenizer_file(run_dir)
        assert tokenizer_file.parent == report_dir / "tokenizers" and not (run_dir / "tokenizer.json.gz").exists()
        assert gzip.decompress(tokenizer_file.read_bytes()) == written.read_bytes()
        assert tokenizer_file.name == f"{hashlib.sha256(written.read_bytes()).hexdigest()[:12]}.json.gz"
        tokenizers.add(written.read_bytes())
    assert len(list((report_dir / "tokenizers").iterdir())) == len(tokenizers)


def test_a_seed_major_study_runs_every_cells_seed_before_the_next(tmp_path):
    families = {**MICRO_STUDY["families"], "other": MICRO_STUDY["families"]["causal"]}
    grid = [{"family": "causal", "seeds": [0, 1]}, {"family": "other", "seeds": [0, 1]}]
    seed_major = load_study_config(write_recipe(tmp_path / "seeds.yaml", families=families, grid=grid, seed_major=True))
    assert [run.name for run in seed_major.runs()] == ["causal-t2-s0", "other-t2-s0", "causal-t2-s1", "other-t2-s1"]
    by_family = load_study_config(write_recipe(tmp_path / "families.yaml", families=families, grid=grid))
    assert [run.name for run in by_family.runs()] == ["causal-t2-s0", "causal-t2-s1", "other-t2-s0", "other-t2-s1"]


def test_the_causes_recipe_crosses_cooperation_and_embedding_sharing():
    study = load_study_config("causes")
    cells = {name: (family.overrides.get("cooperative", True), family.overrides.get("separate_embeddings", False))
             for name, family in study.families.items()}
    assert sorted(cells.values()) == [(False, False), (False, True), (True, False), (True, True)]
    assert [run.seed for run in study.runs()] == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4
    assert study.score_every_text and study.trajectory == [0.25, 1.0]
