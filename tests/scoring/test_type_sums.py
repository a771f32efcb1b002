"""The per-token table recomputed from a scored point's per-type sums, as the scoring command wrote it and as the
study keeps it (float32, the eligible types), and scripts/convert_kept_runs.py turning kept runs of the earlier form
(gzipped per-token CSVs) into that form and back into the same tables."""

import gzip
import hashlib
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from datasets import load_dataset
from test_scoring import BLOCK_SIZE, MIN_COUNT, scored, single_thread, train_probe_replicas  # noqa: F401 (fixtures)

from modeling_twotower import TwoTowerForCausalLM
from twotower.evaluation.tower_preference.measures import PROBE_FREE_MEASURES
from twotower.evaluation.scoring import report, score
from twotower.evaluation.scoring.type_sums import (
    METADATA_KEY, TypeSums, per_token_table_from_sums, read_type_sums, sum_columns, write_kept_type_sums,
)
from twotower.evaluation.study.dataset import stage_dataset, write_dataset_card
from twotower.evaluation.study.document import render_template
from twotower.evaluation.study.full_tables import FULL_TABLES_JSON
from twotower.evaluation.study.kept_tables import load_kept_report

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "convert_kept_runs.py"
REPLICAS = 4
KEPT_TOLERANCE = 1e-5  # float32 sums: log-probs within 1e-6 nats
# the figures that read a variance, which float32 sums move by more than the sums' own rounding (type_sums.py)
VARIANCE_COLUMNS = ("standard_error", "p_value", "significant", "occurrence_", "ablation_p_value",
                    "ablation_significant")
ZERO_SPREAD_P_VALUE = 1e-6  # the p-values of a type with no spread: see assert_tables_close


@pytest.fixture(scope="module")
def cross_fitted(scored, tmp_path_factory):
    """A point scored as the study scores it: 4 probe replicas per tower, centered, cross-fitted over the documents
    of two texts, with the ablation; its report folder and tokenizer."""
    folder = tmp_path_factory.mktemp("cross_fitted")
    texts = folder / "texts"
    texts.mkdir()
    shutil.copyfile(scored["validation_file"], texts / "a.txt")
    shutil.copyfile(scored["train_file"], texts / "b.txt")
    model = train_probe_replicas(
        TwoTowerForCausalLM.from_pretrained(scored["model_dir"]), scored["blocks"]["train"], replicas=REPLICAS
    )
    model.save_pretrained(folder / "model")
    scored["tokenizer"].save_pretrained(folder / "model")
    written = score.score_model(folder / "model", folder / "report", validation_file=str(texts), block_size=BLOCK_SIZE,
                                batch_size=5, min_count=MIN_COUNT, center=True, disable_tqdm=True, cpu=True)
    return {"folder": folder, "report_dir": folder / "report", "report": written, "tokenizer": scored["tokenizer"]}


def table_from_float32_sums(sums, written_report, tokens_of):
    """The per-token table of `sums` rounded to float32, as a study keeps them (with their totals in float64): the
    table a kept one must give back, the figures that read a variance (VARIANCE_COLUMNS) included."""
    columns = sum_columns(sums.table)
    rounded = sums.table.astype(dict.fromkeys(columns, "float32")).astype(dict.fromkeys(columns, "float64"))
    return per_token_table_from_sums(TypeSums(rounded, sums.totals, sums.min_count), written_report, tokens_of)


def assert_tables_close(derived, written, tolerance):
    """Every column of `derived` against the same column of `written`, row by token id."""
    written = written.set_index("token_id").loc[derived["token_id"]].reset_index()
    for column in derived.columns:
        ours, theirs = derived[column].to_numpy(), written[column].to_numpy()
        if column.endswith("p_value"):
            # a type whose occurrences all have one preference (the same context twice) has no spread, which the
            # sums' rounding leaves as 0 on one side and as ~1e-15 on the other: a p-value of 0 against one of
            # ~1e-8 (seen on a 2-core Intel Xeon), both "certain"
            zero_spread = (ours == 0) | (theirs == 0)
            assert (np.fmax(ours, theirs)[zero_spread] < ZERO_SPREAD_P_VALUE).all(), column
            ours, theirs = ours[~zero_spread], theirs[~zero_spread]
        if ours.dtype.kind == "f":
            np.testing.assert_allclose(ours, theirs, rtol=tolerance, atol=tolerance, err_msg=column)
        else:
            assert (ours == theirs.astype(ours.dtype)).all(), column


def test_the_scoring_commands_table_is_recomputed_from_its_sums(cross_fitted):
    written_report, written = report.load_report(cross_fitted["report_dir"])
    tokens_of = cross_fitted["tokenizer"].convert_ids_to_tokens
    sums = read_type_sums(cross_fitted["report_dir"] / "type_sums.parquet")
    assert sums.min_count == 1 and written_report["settings"]["center"]
    derived = per_token_table_from_sums(sums, written_report, tokens_of)
    # every type and every column of the scoring command's table (the part-of-speech ones aside), to float rounding
    assert derived["token_id"].tolist() == written["token_id"].tolist()
    # the sums hold the probes' and the mean ablation's figures, not the other probe-free measures'
    not_summed = {column for column in written.columns
                  if any(column.startswith(f"{measure.name}_") for measure in PROBE_FREE_MEASURES
                         if measure.name != "ablation")}
    assert set(written.columns) - set(derived.columns) - not_summed <= {"pos_tag", "pos_tag_share"}
    assert {"occurrence_p_value", "ablation_p_value", "two_tower_difference_nats"} <= set(derived.columns)
    assert_tables_close(derived, written, 1e-9)
    assert derived["significant"].any() and derived["ablation_significant"].any()  # the tests decide something

    # the study's kept form: the eligible types, float32, the totals in the metadata
    kept = write_kept_type_sums(cross_fitted["folder"] / "kept.parquet", sums.table, MIN_COUNT)
    metadata = json.loads(pq.read_schema(kept).metadata[METADATA_KEY])
    assert metadata["min_count"] == MIN_COUNT
    assert metadata["totals"]["count"] == written_report["cross_fit"]["num_predictions"]
    schema = pq.read_schema(kept)
    assert {str(schema.field(name).type) for name in schema.names if "_sum_" in name} == {"float"}  # float32
    assert [str(schema.field(name).type) for name in ("half", "token_id", "count")] == ["int8", "int32", "int32"]
    from_kept = per_token_table_from_sums(read_type_sums(kept), written_report, tokens_of)
    eligible = written[written["eligible"]]
    assert from_kept["token_id"].tolist() == eligible["token_id"].tolist()
    rounded = table_from_float32_sums(sums, written_report, tokens_of)
    assert_tables_close(from_kept, rounded[rounded["eligible"]], 1e-9)
    # the figures no variance reads, to the scoring's own: a type's occurrence-level variance is its sum of squares
    # less its squared sum over the count, whose float32 rounding moved a p-value of 0.331 by 1e-4 relative (on a
    # 2-core Intel Xeon)
    unmoved = [column for column in from_kept.columns if not column.startswith(VARIANCE_COLUMNS)]
    assert_tables_close(from_kept[unmoved], eligible, KEPT_TOLERANCE)
    with pytest.raises(ValueError, match="min_count"):
        per_token_table_from_sums(read_type_sums(kept), {**written_report, "settings": {
            **written_report["settings"], "min_count": MIN_COUNT - 1}}, tokens_of)


def git(folder, *arguments):
    return subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, check=True, text=True).stdout


def kept_csv(cross_fitted) -> bytes:
    """The scoring command's per-token CSV gzipped as the study kept it (no time stamp: byte-stable)."""
    return gzip.compress((cross_fitted["report_dir"] / report.PER_TOKEN_CSV).read_bytes(), mtime=0)


def kept_run(report_dir, name, cross_fitted, with_sums):
    """A run folder as the study kept it before this form: run.json, preference.json, the gzipped CSV and, with
    `with_sums`, type_sums.parquet as scoring wrote it before its sums of squares, and the tokenizer."""
    source, scores = cross_fitted["report_dir"], cross_fitted["report"]
    kept = report_dir / "runs" / name / "scores" / "wiki"
    kept.mkdir(parents=True)
    shutil.copyfile(source / "preference.json", kept / "preference.json")
    (kept / "preference_per_token.csv.gz").write_bytes(kept_csv(cross_fitted))
    figures = {"cross_fit": scores["cross_fit"]} if with_sums else {}
    summary = {"run": {"name": name, "family": name, "seed": 0, "num_towers": 2}, "scores": {"wiki": figures},
               "trajectory": [{"step": 10, "scores": {"wiki": figures}}]}
    (report_dir / "runs" / name / "run.json").write_text(json.dumps(summary))
    if with_sums:
        sums = pd.read_parquet(source / "type_sums.parquet")
        sums.drop(columns=[column for column in sums if "_sq_sum_" in column]).to_parquet(kept / "type_sums.parquet")
        tokenizer = cross_fitted["folder"] / "model" / "tokenizer.json"
        (report_dir / "runs" / name / "tokenizer.json.gz").write_bytes(gzip.compress(tokenizer.read_bytes()))
    return summary


def test_kept_runs_of_the_earlier_form_convert_and_read_back_the_same_tables(cross_fitted, tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("convert_kept_runs", SCRIPT)
    convert = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(convert)
    repository = tmp_path / "repository"
    report_dir = repository / "docs" / "study"
    summaries = [kept_run(report_dir, "summed", cross_fitted, with_sums=True),
                 kept_run(report_dir, "legacy", cross_fitted, with_sums=False)]
    git(repository, "init", "-q")
    git(repository, "add", ".")
    git(repository, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "kept runs")
    commit = git(repository, "rev-parse", "HEAD").strip()
    _, original = report.load_report(cross_fitted["report_dir"])
    eligible = original[original["eligible"]]

    removed = convert.convert_report_folder(report_dir)
    csv = "scores/wiki/preference_per_token.csv.gz"
    assert sorted(entry["path"] for entry in removed) == [f"runs/legacy/{csv}", f"runs/summed/{csv}"]
    assert {entry["revision"] for entry in removed} == {commit}
    assert not list(report_dir.rglob("*.csv.gz"))
    for name, kept_file in (("summed", "type_sums.parquet"), ("legacy", "type_totals.parquet")):
        folder = report_dir / "runs" / name / "scores" / "wiki"
        assert sorted(path.name for path in folder.iterdir()) == ["preference.json", kept_file]
        table = load_kept_report(folder).table
        # the documents' columns, recomputed; the occurrence-level and ablation p-values need squares neither has
        assert "occurrence_p_value" not in table and "ablation_p_value" not in table
        assert {"p_value", "significant", "two_tower_difference_nats", "probe_mean_logprob_probe7",
                "ablation_preference_nats_tower1"} <= set(table.columns)
        assert table["token_id"].tolist() == eligible["token_id"].tolist()
        assert_tables_close(table, eligible, KEPT_TOLERANCE)
        assert table["significant"].any()

    # the run's tokenizer moved into the folder's shared copy, named by its sha256, which its run.json names
    tokenizer = (cross_fitted["folder"] / "model" / "tokenizer.json").read_bytes()
    shared = report_dir / "tokenizers" / f"{hashlib.sha256(tokenizer).hexdigest()[:12]}.json.gz"
    assert not list(report_dir.glob("runs/*/tokenizer.json.gz"))
    assert gzip.decompress(shared.read_bytes()) == tokenizer
    assert json.loads((report_dir / "runs" / "summed" / "run.json").read_text()) == {
        **summaries[0], "kept_tokenizer": shared.relative_to(report_dir).as_posix()}

    # again: nothing changes; the folder's sizes fall
    before = {path: path.read_bytes() for path in report_dir.rglob("*") if path.is_file()}
    assert convert.convert_report_folder(report_dir) == []
    assert {path: path.read_bytes() for path in report_dir.rglob("*") if path.is_file()} == before

    # the removed tables come back from git, byte for byte, into the Hub dataset staging (the legacy run alone: a
    # folder without type sums gets a card for them too)
    git(repository, "rm", "-q", "-r", "--cached", "docs/study/runs/summed")
    shutil.rmtree(report_dir / "runs" / "summed")
    manifest = json.loads((report_dir / FULL_TABLES_JSON).read_text())
    manifest["tables"] = [entry for entry in manifest["tables"] if entry["path"].startswith("runs/legacy/")]
    (report_dir / FULL_TABLES_JSON).write_text(json.dumps(manifest))
    write_dataset_card(summaries[1:], report_dir, None, render_template)
    staged = stage_dataset(report_dir, tmp_path / "staged")
    assert (staged / "runs" / "legacy" / csv).read_bytes() == kept_csv(cross_fitted)
    assert (staged / "runs" / "legacy" / "scores" / "wiki" / "type_totals.parquet").is_file()
    rows = load_dataset(str(staged), "full_tables", split="legacy.wiki", cache_dir=str(tmp_path / "cache"))
    assert rows.num_rows == len(original)

    # a CSV that no revision holds is the only record of its point: it stays until committed
    kept_run(report_dir, "uncommitted", cross_fitted, with_sums=False)
    assert convert.convert_report_folder(report_dir) == []
    assert "commit it, then run this script again" in capsys.readouterr().out
    assert (report_dir / "runs" / "uncommitted" / csv).is_file()
    assert load_kept_report(report_dir / "runs" / "uncommitted" / "scores" / "wiki").table.equals(original)

