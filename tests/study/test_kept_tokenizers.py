"""The runs' tokenizers kept once per report folder (REPORT_DIR/tokenizers/DIGEST.json.gz, named in run.json): runs
that share a tokenizer share its file and read it back byte for byte, a run kept before the shared folder still reads
its own, and scripts/convert_kept_runs.py moves runs' own copies into the shared one, removing nothing it has not read
back, and changes nothing when run again."""

import gzip
import hashlib
import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest
from test_study_factorial import planted_study, study_of
from tokenizers import Tokenizer, models

from twotower.evaluation.study.dataset import RUN_INDEX_PARQUET, stage_dataset, write_dataset_card
from twotower.evaluation.study.document import render_template
from twotower.evaluation.study.kept_files import kept_run_problem
from twotower.evaluation.study.kept_tables import (
    keep_tokenizer, kept_tokenizer_file, read_kept_tokenizer, tokens_of_kept_tokenizer,
)
from twotower.evaluation.study.parts_of_speech import type_tags_path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "convert_kept_runs.py"


def tokenizer_json(words) -> bytes:
    """A word-level tokenizer's tokenizer.json, as the tokenizers library saves one."""
    return Tokenizer(models.WordLevel({word: index for index, word in enumerate(words)}, unk_token=words[0])).to_str(
        pretty=True).encode()


FIRST, OTHER = tokenizer_json(["<unk>", "the", "tower"]), tokenizer_json(["<unk>", "a", "probe", "pair"])


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def earlier_run(report_dir: Path, name: str, tokenizer: bytes) -> dict:
    """A run folder as the study kept it before the shared folder: run.json (as the study writes it) and its own
    gzipped tokenizer.json."""
    run_dir = report_dir / "runs" / name
    run_dir.mkdir(parents=True)
    summary = {"run": {"name": name, "family": "causal", "seed": 0, "num_towers": 2},
               "trajectory": [{"step": 10, "scores": {}}], "scores": {}}
    (run_dir / "run.json").write_text(json.dumps(summary, indent=2) + "\n")
    (run_dir / "tokenizer.json.gz").write_bytes(gzip.compress(tokenizer, mtime=0))
    return summary


def load_converter():
    spec = importlib.util.spec_from_file_location("convert_kept_runs", SCRIPT)
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    return convert


def folder_bytes(folder: Path) -> dict:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def test_runs_sharing_a_tokenizer_keep_one_file_that_each_reads_back(tmp_path):
    report_dir = tmp_path / "report"
    names = {"a": FIRST, "b": FIRST, "c": OTHER}
    for name, tokenizer in names.items():
        run_dir = report_dir / "runs" / name
        run_dir.mkdir(parents=True)
        summary = {"run": {"name": name}, "kept_tokenizer": keep_tokenizer(report_dir, tokenizer)}
        (run_dir / "run.json").write_text(json.dumps(summary))
    # one file per distinct tokenizer, named by the first 12 hex digits of its tokenizer.json's sha256
    assert sorted(path.name for path in (report_dir / "tokenizers").iterdir()) == sorted(
        f"{digest(data)}.json.gz" for data in (FIRST, OTHER))
    for name, tokenizer in names.items():
        tokenizer_file = kept_tokenizer_file(report_dir / "runs" / name)
        assert tokenizer_file == report_dir / "tokenizers" / f"{digest(tokenizer)}.json.gz"
        assert gzip.decompress(tokenizer_file.read_bytes()) == tokenizer
        assert kept_run_problem(report_dir / "runs" / name) is None
        # the texts' tags under a tokenizer carry the name of its kept file
        assert type_tags_path(report_dir, "wiki", tokenizer_file).name == f"wiki-{digest(tokenizer)}.parquet"
    assert tokens_of_kept_tokenizer(kept_tokenizer_file(report_dir / "runs" / "c"))([1, 2, 3]) == ["a", "probe", "pair"]
    # keeping a tokenizer again leaves its file as it is; a damaged one is written again
    shared = report_dir / "tokenizers" / f"{digest(FIRST)}.json.gz"
    before = shared.stat().st_mtime_ns
    keep_tokenizer(report_dir, FIRST)
    assert shared.stat().st_mtime_ns == before
    shared.write_bytes(shared.read_bytes()[:20])
    assert "cannot be read" in kept_run_problem(report_dir / "runs" / "a")
    keep_tokenizer(report_dir, FIRST)
    assert read_kept_tokenizer(shared) == FIRST and kept_run_problem(report_dir / "runs" / "a") is None


def test_a_runs_shared_tokenizer_is_checked_with_the_run(tmp_path):
    report_dir = tmp_path / "report"
    run_dir = report_dir / "runs" / "a"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"kept_tokenizer": keep_tokenizer(report_dir, FIRST)}))
    shared = kept_tokenizer_file(run_dir)
    shared.write_bytes(gzip.compress(OTHER))  # a file that is not the tokenizer its name says
    assert "does not hold the tokenizer its name says" in kept_run_problem(run_dir)
    shared.unlink()
    assert "is missing" in kept_run_problem(run_dir)


def test_the_converter_moves_each_runs_tokenizer_into_the_shared_copy_once(tmp_path, capsys):
    convert = load_converter()
    report_dir = tmp_path / "report"
    summaries = {name: earlier_run(report_dir, name, tokenizer)
                 for name, tokenizer in {"a": FIRST, "b": FIRST, "c": OTHER}.items()}
    # a run kept before the shared folder reads its own tokenizer
    assert kept_tokenizer_file(report_dir / "runs" / "a") == report_dir / "runs" / "a" / "tokenizer.json.gz"

    assert convert.convert_report_folder(report_dir) == []
    assert "its tokenizer is now" in capsys.readouterr().out
    assert not list(report_dir.glob("runs/*/tokenizer.json.gz"))
    assert len(list((report_dir / "tokenizers").iterdir())) == 2
    for name, tokenizer in {"a": FIRST, "b": FIRST, "c": OTHER}.items():
        run_json = (report_dir / "runs" / name / "run.json").read_text()
        path = f"tokenizers/{digest(tokenizer)}.json.gz"
        # run.json gains the field alone, written as the study writes it
        assert run_json == json.dumps({**summaries[name], "kept_tokenizer": path}, indent=2) + "\n"
        assert gzip.decompress((report_dir / path).read_bytes()) == tokenizer
        assert kept_tokenizer_file(report_dir / "runs" / name) == report_dir / path

    before = folder_bytes(report_dir)
    assert convert.convert_report_folder(report_dir) == []
    assert folder_bytes(report_dir) == before


def test_the_converter_removes_no_tokenizer_it_cannot_match(tmp_path):
    convert = load_converter()
    report_dir = tmp_path / "report"
    earlier_run(report_dir, "damaged", FIRST)
    own = report_dir / "runs" / "damaged" / "tokenizer.json.gz"
    own.write_bytes(own.read_bytes()[:-8])  # cut short: its length and CRC are missing
    with pytest.raises(ValueError, match="cannot be read"):
        convert.convert_report_folder(report_dir)
    assert own.is_file() and not (report_dir / "tokenizers").exists()

    # a run.json naming another tokenizer than the run's own copy: both stay
    own.unlink()
    summary = earlier_run(report_dir, "named", FIRST)
    run_json = report_dir / "runs" / "named" / "run.json"
    run_json.write_text(json.dumps({**summary, "kept_tokenizer": keep_tokenizer(report_dir, OTHER)}))
    with pytest.raises(ValueError, match="both stay"):
        convert.convert_report_folder(report_dir)
    assert read_kept_tokenizer(report_dir / "runs" / "named" / "tokenizer.json.gz") == FIRST
    assert read_kept_tokenizer(kept_tokenizer_file(report_dir / "runs" / "named")) == OTHER


def test_the_dataset_index_names_each_runs_tokenizer_and_the_hub_copy_holds_it(tmp_path):
    report_dir = tmp_path / "report"
    summaries = planted_study(report_dir / "runs", lambda c, e: 0.5, seeds=1)
    for index, summary in enumerate(summaries):
        summary["kept_tokenizer"] = keep_tokenizer(report_dir, FIRST if index % 2 else OTHER)
        (report_dir / "runs" / summary["run"]["name"] / "run.json").write_text(json.dumps(summary))
    write_dataset_card(summaries, report_dir, study_of(), render_template)
    index = pd.read_parquet(report_dir / RUN_INDEX_PARQUET)
    expected = {summary["run"]["name"]: summary["kept_tokenizer"] for summary in summaries}
    assert index.groupby("run")["tokenizer_path"].agg(set).to_dict() == {run: {path} for run, path in expected.items()}
    staged = stage_dataset(report_dir, tmp_path / "staged")
    assert {path: (staged / path).read_bytes() for path in expected.values()} == {
        path: (report_dir / path).read_bytes() for path in expected.values()}
    assert len(list((staged / "tokenizers").iterdir())) == 2
