"""The 2x2 of cooperation and embedding sharing end to end on a micro study: the document's section and study.json
from the kept files, the per-type tables as a dataset (load_dataset, the card, --push_to_hub --dry-run), and the
plain-numpy recomputation (scripts/recompute_study.py) finding the document's numbers."""

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from datasets import load_dataset
from huggingface_hub import HfApi

from recomputed import RECOMPUTE, assert_factorial_recomputed, recomputed
from test_study import write_lines
from twotower.evaluation.study import driver as study_module
from twotower.evaluation.study.driver import run_study
from twotower.evaluation.study.factorial import CELL_NAMES

pytestmark = pytest.mark.slow  # trains 8 micro models

REPO_ROOT = Path(__file__).resolve().parents[2]
MICRO_2X2 = {
    "train_file": "wiki/train.txt",
    "validation_file": "wiki/valid.txt",
    "eval_texts": {"wiki-test": {"file": "wiki/test.txt"}, "books": {"file": "books", "max_tokens": 16 * 128}},
    "families": {
        "causal": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe"},
        "causal_separate": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe",
                            "overrides": {"separate_embeddings": True}},
        "causal_control": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe",
                           "overrides": {"cooperative": False}, "control_of": "causal"},
        "causal_control_separate": {"pretrain_recipe": "tiny", "probe_recipe": "tiny_probe", "control_of": "causal_separate",
                                    "overrides": {"cooperative": False, "separate_embeddings": True}},
    },
    "grid": [{"family": name, "seeds": [0, 1]} for name in
             ("causal", "causal_separate", "causal_control", "causal_control_separate")],
    "seed_major": True,
    "trajectory": [1.0],  # one point keeps the test short; tests/study/test_study_factorial.py plants two
    "pretrain": {"tokenizer_vocab_size": 2048, "max_train_steps": 4, "num_warmup_steps": 1, "eval_steps": 4,
                 "max_eval_blocks": 2, "checkpointing_steps": None, "per_device_train_batch_size": 8},
    "probe": {"probe_replicas": 2, "probe_replica_data": "disjoint", "max_train_steps": 4, "num_warmup_steps": 1,
              "eval_steps": 2, "max_eval_blocks": 2, "checkpointing_steps": None, "per_device_train_batch_size": 8},
    "scoring": {"batch_size": 8, "min_count": 3},
}


@pytest.fixture(scope="module")
def micro_2x2(tmp_path_factory, shared_data):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("causes")
    data_dir = root / "data"
    wiki = shared_data / "wikitext-2"
    write_lines(data_dir / "wiki" / "train.txt", wiki / "train.txt", 0, 800)
    write_lines(data_dir / "wiki" / "valid.txt", wiki / "valid.txt", 0, 100)
    write_lines(data_dir / "wiki" / "test.txt", wiki / "test.txt", 0, 80)
    for novel in ("pg11_alice_in_wonderland.txt", "pg35_the_time_machine.txt"):
        write_lines(data_dir / "books" / novel, shared_data / "gutenberg" / novel, 100, 250)
    recipe = root / "causes.yaml"
    recipe.write_text(yaml.safe_dump(MICRO_2X2, sort_keys=False))
    report = Path(run_study(str(recipe), data_dir, root / "out", root / "report", command="micro 2x2"))
    return {"recipe": recipe, "data_dir": data_dir, "root": root, "report_dir": report.parent,
            "document": report.read_text(), "results": json.loads((report.parent / "study.json").read_text())}


def test_the_document_reports_the_2x2_from_the_kept_files(micro_2x2):
    factorial = micro_2x2["results"]["factorial"]
    assert [(p["text"], p["step"]) for p in factorial["points"]] == [("wiki-test", 4), ("books", 4)]
    runs_dir = micro_2x2["report_dir"] / "runs"
    for point in factorial["points"]:
        endpoint = point["endpoints"]["cross_fitted_r"]
        assert endpoint["df"] == 4 and set(endpoint["cells"]) == set(CELL_NAMES.values())
        for run, value in endpoint["per_run"].items():  # endpoint 1 is what each run's scoring wrote
            summary = json.loads((runs_dir / run / "run.json").read_text())
            scores = next(p for p in summary["trajectory"] if p["step"] == point["step"])["scores"][point["text"]]
            # from the kept float32 sums: within 2e-7 of the scoring's r (evaluation/scoring/type_sums.py)
            assert value == pytest.approx(scores["cross_fit"]["cross_fitted_r"], abs=1e-6)
        assert set(point["cross_seed"]["cells"]) == set(CELL_NAMES.values())
        # endpoint 3 from the text tagged once and kept (the test extra installs spaCy's model)
        pos = point["endpoints"]["part_of_speech_z"]
        assert pos["df"] == 4 and set(pos["signs"]) == set(CELL_NAMES.values())
        assert all(-50 < z < 50 for z in pos["per_run"].values())
    assert sorted(path.name.split("-")[0] for path in (micro_2x2["report_dir"] / "type_tags").iterdir()) == [
        "books", "wiki"]
    document = micro_2x2["document"]
    assert "## What causes the split: the 2x2" in document
    assert factorial["verdict"]["explanation"] in document
    assert f"The paper's syntax/semantics reading: *{factorial['verdict']['syntax_reading']}*" in document
    assert "### Part-of-speech contrast: its sign across seeds" in document
    assert "probe replicas trained on disjoint slices of the training text" in document


def test_the_kept_tables_load_as_a_dataset_with_their_card(micro_2x2, tmp_path):
    report_dir = micro_2x2["report_dir"]
    # a cache of its own: datasets reuses a cached table of a folder with the same name, even another run's
    cache = str(tmp_path / "datasets-cache")
    index = load_dataset(str(report_dir), "run_index", split="train", cache_dir=cache).to_pandas()
    assert len(index) == 8 * 2  # runs x texts
    row = index[(index["run"] == "causal_control_separate-t2-s1") & (index["text"] == "books")].iloc[0]
    assert not row["cooperative"] and row["separate_embeddings"] and row["split"] == "step_4.books"
    sums = load_dataset(str(report_dir), row["run"], split=row["split"], cache_dir=cache).to_pandas()
    kept = pd.read_parquet(report_dir / row["path"])
    assert sums.equals(kept)
    tags_split = Path(row["type_tags_path"]).stem.replace("-", "_")
    tags = load_dataset(str(report_dir), "type_tags", split=tags_split, cache_dir=cache).to_pandas()
    assert tags.equals(pd.read_parquet(report_dir / row["type_tags_path"]))


def test_push_to_hub_dry_run_stages_and_uploads_nothing(micro_2x2, monkeypatch, capsys):
    def no_network(*args, **kwargs):
        raise AssertionError("a dry run must not reach the Hub")

    monkeypatch.setattr(HfApi, "upload_folder", no_network)
    monkeypatch.setattr(HfApi, "create_repo", no_network)
    out = micro_2x2["root"] / "out"
    study_module.main(["--recipe", str(micro_2x2["recipe"]), "--data_dir", str(micro_2x2["data_dir"]),
                       "--output_dir", str(out), "--report_dir", str(micro_2x2["report_dir"]), "--aggregate_only",
                       "--push_to_hub", "someone/tower-study", "--dry-run"])
    printed = capsys.readouterr().out
    staged = out / "hub-dataset"
    assert "Dry run: nothing uploaded." in printed
    assert "runs/causal-t2-s0/scores/wiki-test/type_sums.parquet" in printed
    assert (staged / "README.md").read_text() == (micro_2x2["report_dir"] / "README.md").read_text()
    assert len(list(staged.glob("runs/*/**/type_sums.parquet"))) == 16
    assert len(list(staged.glob("type_tags/*.parquet"))) == 2
    assert load_dataset(str(staged), "causal-t2-s1", split="step_4.books").num_rows > 0


def test_plain_numpy_script_recomputes_the_documents_figures(micro_2x2):
    recomputed_figures = recomputed(micro_2x2["report_dir"])
    assert assert_factorial_recomputed(recomputed_figures, micro_2x2["results"]["factorial"]) > 50
    # and the rounded figures it prints are the document's
    script = runpy.run_path(str(RECOMPUTE))
    printed = [script["with_ci"](figure) for point in recomputed_figures["points"]
               for figure in point["value"]["effects"].values()]
    assert all(figure in micro_2x2["document"] for figure in printed)
    assert "package" not in subprocess.run(
        [sys.executable, "-c", f"import runpy, sys; runpy.run_path({str(RECOMPUTE)!r}); "
                               "print('package' if 'twotower' in sys.modules else '')"],
        capture_output=True, text=True, check=True).stdout
