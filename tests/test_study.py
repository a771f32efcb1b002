"""The study driver end to end on a micro grid: runs, noise floor, resume, aggregation, and its errors."""

import json

import numpy as np
import pytest
import torch
import yaml
from scipy import stats
from torch.utils.data import DataLoader

from twotower.evaluation import study as study_module
from twotower.evaluation.report import load_report
from twotower.evaluation.score import ScoringArguments, load_blocks, load_model
from twotower.evaluation.study import load_study_config, run_study
from twotower.evaluation.study_report import correlation_p_value
from twotower.evaluation.study_scoring import evenly_spaced_blocks
from twotower.evaluation.tower_preference.preference_stats import compare_preferences, compute_preference
from twotower.training.data import collate_blocks
from twotower.training.tokenizer import load_tokenizer


MICRO_STUDY = {
    "train_file": "wiki/train.txt",
    "validation_file": "wiki/valid.txt",
    "eval_texts": {"wiki-test": {"file": "wiki/test.txt"}, "books": {"file": "books", "max_blocks": 12}},
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
        "checkpointing_steps": 0,
        "per_device_train_batch_size": 8,
    },
    "probe": {
        "max_train_steps": 30,
        "num_warmup_steps": 1,
        "eval_steps": 3,
        "early_stopping_patience": 1,
        "max_eval_blocks": 4,
        "checkpointing_steps": 0,
        "per_device_train_batch_size": 8,
    },
    "scoring": {"batch_size": 8, "min_count": 5},
}


def write_lines(path, source, start, count):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[start : start + count]), encoding="utf-8")


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
    recipe = root / "micro.yaml"
    recipe.write_text(yaml.safe_dump(MICRO_STUDY))
    output_dir = root / "out"
    report = run_study(str(recipe), data_dir, output_dir, command="micro study")
    return {"recipe": recipe, "data_dir": data_dir, "output_dir": output_dir, "report": report}


def gold_logprobs_directly(model_dir, text_file, max_blocks=None):
    """(targets [n], probe log-probs [towers, n]) of a probe model over a text, run without the study code."""
    tokenizer = load_tokenizer(str(model_dir))
    args = ScoringArguments(model_dir=str(model_dir), output_dir="unused", validation_file=str(text_file))
    blocks = evenly_spaced_blocks(load_blocks(args, tokenizer), max_blocks)
    model = load_model(str(model_dir), torch.float32)
    targets, gold = [], []
    with torch.no_grad():
        for batch in DataLoader(blocks.with_format("torch"), batch_size=5, collate_fn=collate_blocks):
            targets.append(batch["input_ids"][:, 1:].flatten())
            gold.append(model.probe_logprobs(batch["input_ids"]).flatten(1))
    return torch.cat(targets).numpy(), torch.cat(gold, dim=1).numpy()


def test_noise_floor_and_two_tower_preference_match_an_independent_computation(micro_study):
    run_dir = micro_study["output_dir"] / "runs" / "causal-t2-s0"
    text = micro_study["data_dir"] / "books"
    targets, gold_a = gold_logprobs_directly(run_dir / "probe-s0" / "model", text, max_blocks=12)
    targets_b, gold_b = gold_logprobs_directly(run_dir / "probe-s1000" / "model", text, max_blocks=12)
    np.testing.assert_array_equal(targets, targets_b)
    expected = {
        "towers": gold_a,
        "towers_replica": gold_b,
        "towers_across_runs": np.stack([gold_a[0], gold_b[1]]),
        "same_tower_0": np.stack([gold_a[0], gold_b[0]]),
        "same_tower_1": np.stack([gold_a[1], gold_b[1]]),
    }
    scores = json.loads((run_dir / "scores" / "books" / "scores.json").read_text())
    for pair, gold in expected.items():
        for kind, center in (("centered", True), ("raw", False)):
            summary = compute_preference(targets, gold, min_count=5, center=center).summary
            for key, value in scores["pairs"][pair][kind].items():
                np.testing.assert_allclose(value, summary[key], rtol=1e-6, atol=1e-9, err_msg=f"{pair} {kind} {key}")
    results = [compute_preference(targets, gold, min_count=5, center=True) for gold in (gold_a, gold_b)]
    eligible = [(result.token_ids[result.eligible], result.preference_nats[:, result.eligible]) for result in results]
    replica = compare_preferences(*eligible[0], *eligible[1])
    assert scores["replica_correlation"] == pytest.approx(replica["correlation"], rel=1e-6)
    assert scores["replica_num_types"] == replica["num_shared_types"]
    probe_perplexity = np.exp(-gold_a.astype(np.float64).mean(axis=1))
    np.testing.assert_allclose(scores["perplexity"]["probe_sets"][0], probe_perplexity, rtol=1e-5)
    assert scores["data"]["num_blocks"] == 12


def test_probe_sets_differ_and_stop_on_validation_loss(micro_study):
    summary = json.loads((micro_study["output_dir"] / "runs" / "causal-t2-s0" / "run.json").read_text())
    probe_a, probe_b = summary["probes"]
    assert probe_a["eval_metrics"] != probe_b["eval_metrics"]  # another seed: other initial weights and data order
    for probe in (probe_a, probe_b):
        assert probe["best_step"] % 3 == 0 and probe["best_step"] <= probe["completed_steps"] <= 30
        assert probe["stopped_early"] == (probe["completed_steps"] < 30)


def test_report_aggregates_every_run(micro_study):
    report_dir = micro_study["report"].parent
    text = micro_study["report"].read_text()
    study = json.loads((report_dir / "study.json").read_text())
    assert {row["run"] for row in study["runs"]} == {"causal-t2-s0", "causal-t2-s1", "control-t2-s0"}
    assert len(study["runs"]) == 6  # three runs x two texts
    for name in ("noise_floor.png", "cross_seed.png", "categories_causal-t2_books.png"):
        assert (report_dir / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "micro study" in text and "**cooperation** (causal vs control, its independent-towers control)" in text

    # the cross-seed correlation is compare_preferences over the two seeds' eligible centered preferences
    (causal_books,) = [row for row in study["cross_seed"] if row["family"] == "causal" and row["text"] == "books"]
    tables = [
        load_report(micro_study["output_dir"] / "runs" / f"causal-t2-s{seed}" / "scores" / "books" / "towers")[1]
        for seed in (0, 1)
    ]
    eligible = [table[table["eligible"]] for table in tables]
    expected = compare_preferences(
        eligible[0]["token_id"],
        eligible[0][["preference_nats_tower0", "preference_nats_tower1"]].T.to_numpy(),
        eligible[1]["token_id"],
        eligible[1][["preference_nats_tower0", "preference_nats_tower1"]].T.to_numpy(),
    )
    assert causal_books["correlation"] == pytest.approx(expected["correlation"])


def test_finished_runs_are_not_repeated(micro_study, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("a finished run was trained again")

    monkeypatch.setattr(study_module, "training_function", fail)
    before = (micro_study["report"].parent / "study.json").read_text()
    run_study(str(micro_study["recipe"]), micro_study["data_dir"], micro_study["output_dir"], command="micro study")
    assert (micro_study["report"].parent / "study.json").read_text() == before


def test_bad_study_options(micro_study, tmp_path):
    with pytest.raises(FileNotFoundError, match="known recipes"):
        load_study_config("no-such-study")
    bad = {**MICRO_STUDY, "grid": [{"family": "nope"}]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="names family 'nope'"):
        load_study_config(str(tmp_path / "bad.yaml"))
    with pytest.raises(ValueError, match="selects none"):
        run_study(str(micro_study["recipe"]), micro_study["data_dir"], tmp_path / "out", runs_pattern="^lstm")
    with pytest.raises(FileNotFoundError, match="--data_dir"):
        run_study(str(micro_study["recipe"]), tmp_path / "missing", tmp_path / "out")


def test_shipped_study_recipes_load():
    cpu = load_study_config("cpu")
    assert [run.name for run in cpu.runs()][:3] == ["causal-t2-s0", "causal-t2-s1", "causal-t2-s2"]
    assert load_study_config("gpu").families["control"].control_of == "causal"


def test_correlation_p_value_is_pearsons():
    generator = np.random.default_rng(0)
    x = generator.normal(size=60)
    for y in (generator.normal(size=60), x + generator.normal(size=60), -x + generator.normal(size=60)):
        result = stats.pearsonr(x, y)
        assert correlation_p_value(result.statistic, 60) == pytest.approx(result.pvalue, rel=1e-9)
