"""
Convert the kept runs of a tower preference study's report folder to the kept form of today's study
(evaluation/study/kept_tables.py): per scored point, per-type sums in place of gzipped per-token CSVs; one shared
copy of each tokenizer; the folder's figures as palette PNGs.

    python scripts/convert_kept_runs.py docs/study/causes           # after copying in runs kept by earlier code
    python scripts/convert_kept_runs.py docs/study --revision HEAD   # the revision that holds the CSVs (default)

In every kept run (REPORT_DIR/runs/RUN with its run.json), at every point and text:

- a type_sums.parquet as the scoring command wrote it (every type, float64) is rewritten in the kept form: the types
  seen min_count times, float32 sums, the totals over all types in its metadata, zstd; its columns stay as they are
  (sums of squares only where its scoring wrote them);
- preference_per_token.csv.gz is removed where the point keeps type sums (its per-token table is recomputed from
  them: the occurrence-level and ablation p-values only where the sums have their squares);
- elsewhere (a run scored before type sums) the CSV becomes type_totals.parquet (kept_tables.write_type_totals), and
  is removed only where the git revision holds it byte for byte; otherwise it stays, and the script says so: commit
  it, then run the script again.

In every kept run with its own tokenizer (runs/RUN/tokenizer.json.gz, as the study kept it before the shared folder),
the tokenizer moves into the report folder's shared copy, REPORT_DIR/tokenizers/DIGEST.json.gz (each distinct
tokenizer once: kept_tables.keep_tokenizer), and run.json names it (`kept_tokenizer`); the run's own copy is removed
only after the shared copy is read back with the same tokenizer.json bytes.

The figures of the report folder (REPORT_DIR/*.png) that earlier code saved as RGBA PNGs are written again as
today's study saves them (scoring/report.py save_figure: palette PNGs, a third of the bytes, the same picture).

Every removed CSV that the revision holds is listed in REPORT_DIR/full_tables.json with that revision and its
sha256 (evaluation/study/full_tables.py), from where `--push_to_hub` stages it into the study's Hub dataset. Nothing
is replaced before its new form is checked: the per-token table recomputed from it against the CSV (every column
both hold, within 1e-5 relative or absolute: the kept sums are float32), and a point's cross-fitted r recomputed from
its kept sums against its run.json's (within 1e-6). Running the script again changes nothing.

A report folder that no document reads again may leave its runs' kept tables to git and the Hub dataset:

    python scripts/convert_kept_runs.py docs/study/crossfit --archive_runs   # --revision HEAD (default)
    python scripts/convert_kept_runs.py docs/study/crossfit --restore_runs   # before the study aggregates it again

--archive_runs removes every kept run table (each point's type_sums.parquet or type_totals.parquet) that the
revision holds byte for byte, after listing it in REPORT_DIR/full_tables.json (kind archived_run_table) with that
revision and its sha256; a table the revision does not hold stays, and the script says so: commit it, then run the
script again. The document, its study.json, figures, dataset card and index, and every run.json and preference.json
stay. --restore_runs writes every archived table back from its revision, checked against its sha256 (a shallow clone
is told which revision to fetch); full_tables.json stays as it is, so that archiving again changes nothing. Until
then the study command refuses to aggregate the folder, and `--push_to_hub` stages the tables from their revision
(evaluation/study/full_tables.py).
"""

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from twotower.evaluation.scoring.cross_fitting import CrossFittedPreference
from twotower.evaluation.scoring.report import load_report, repack_png
from twotower.evaluation.scoring.report_files import PER_TOKEN_CSV, TYPE_SUMS_PARQUET
from twotower.evaluation.scoring.type_sums import METADATA_KEY, PROBE_SUMS, read_type_sums, write_kept_type_sums
from twotower.evaluation.study.full_tables import (
    FULL_TABLES_JSON, archive_run_tables, record_full_tables, restore_run_tables, revision_holding, sha256_of,
)
from twotower.evaluation.study.kept_tables import (
    KEPT_TOKENIZER, RUN_SUMMARY, RUN_TOKENIZER_KEY, TYPE_TOTALS_PARQUET, keep_tokenizer, kept_tokenizer_file,
    per_token_table_of_sums, per_token_table_of_totals, read_kept_tokenizer, write_type_totals,
)
from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.errors import TwoTowerUserError

CSV_GZ = f"{PER_TOKEN_CSV}.gz"
TABLE_TOLERANCE = 1e-5  # float32 sums against the CSV's float64 figures (evaluation/scoring/type_sums.py)
CROSS_FIT_TOLERANCE = 1e-6  # float32 sums move a cross-fitted r by at most 2e-7


def is_kept_form(path: Path) -> bool:
    return METADATA_KEY in (pq.read_schema(path).metadata or {})


def point_folders(run_dir: Path, summary: dict):
    """(score folder, its run.json figures) of every point and text of a kept run."""
    last = summary["trajectory"][-1]["step"]
    for point in summary["trajectory"]:
        point_dir = run_dir if point["step"] == last else run_dir / "trajectory" / f"step-{point['step']}"
        for text, scores in point["scores"].items():
            yield point_dir / "scores" / text, scores


def check_same_table(converted, original, where: Path) -> None:
    """The converted point's per-token table against its CSV's, on the types and columns both hold."""
    original = original.set_index("token_id").loc[converted["token_id"]]
    for column in converted.columns.drop("token_id"):
        ours, theirs = converted[column].to_numpy(), original[column].to_numpy()
        same = (np.allclose(ours, theirs, rtol=TABLE_TOLERANCE, atol=TABLE_TOLERANCE, equal_nan=True)
                if ours.dtype.kind == "f" else np.array_equal(ours.astype(theirs.dtype), theirs))
        if not same:
            raise ValueError(f"{where}: the converted table's {column} is not the CSV's; nothing was replaced.")


def check_cross_fitted_r(sums_path: Path, scores: dict, num_towers: int) -> None:
    """The cross-fitted r recomputed from kept sums against the one the point's scoring wrote."""
    sums = read_type_sums(sums_path).table
    replicas = sum(column.startswith(PROBE_SUMS) for column in sums.columns) // num_towers
    recomputed = CrossFittedPreference.from_type_sums(sums, num_towers, replicas).compute(
        scores["cross_fit"]["min_count"])["cross_fitted_r"]
    written = scores["cross_fit"]["cross_fitted_r"]
    if (recomputed is None) != (written is None) or (
            written is not None and abs(recomputed - written) > CROSS_FIT_TOLERANCE):
        raise ValueError(f"{sums_path}: its kept form gives a cross-fitted r of {recomputed}, its run.json "
                         f"{written}; nothing was replaced.")


def share_tokenizer(run_dir: Path, summary: dict) -> bool:
    """
    Move a kept run's own tokenizer (runs/RUN/tokenizer.json.gz) into the report folder's shared copy and name that
    in its run.json (rewritten as the study writes it); True where one moved. The run's copy is removed only after
    the shared copy reads back as the same tokenizer.json, byte for byte: a damaged copy, or a run.json naming
    another tokenizer, is an error and nothing is removed.
    """
    own = run_dir / KEPT_TOKENIZER
    if not own.is_file():
        return False
    data = read_kept_tokenizer(own)
    if data is None:
        raise ValueError(f"{own} cannot be read (damaged or cut short); it stays, and nothing was moved.")
    report_dir = run_dir.parent.parent
    if not summary.get(RUN_TOKENIZER_KEY):
        summary[RUN_TOKENIZER_KEY] = keep_tokenizer(report_dir, data)
        if read_kept_tokenizer(kept_tokenizer_file(run_dir, summary)) != data:
            raise ValueError(f"{kept_tokenizer_file(run_dir, summary)} does not read back as {own}; nothing removed.")
        write_text_atomically(run_dir / RUN_SUMMARY, json.dumps(summary, indent=2, allow_nan=False) + "\n")
    shared = kept_tokenizer_file(run_dir, summary)
    if read_kept_tokenizer(shared) != data:
        raise ValueError(f"{run_dir / RUN_SUMMARY} names the tokenizer {shared}, which does not hold the bytes of "
                         f"the run's own {own}; both stay: check which one the run was scored with.")
    own.unlink()
    return True


def convert_point(score_folder: Path, scores: dict, run_dir: Path, num_towers: int, revision: str) -> dict | None:
    """
    Convert one score folder; returns the full_tables.json entry of the CSV it removed (None where it removed none,
    or removed one no revision holds). The new files are written and checked in a staging folder, then moved in.
    """
    sums_path, csv_path = score_folder / TYPE_SUMS_PARQUET, score_folder / CSV_GZ
    has_sums, has_csv = sums_path.is_file(), csv_path.is_file()
    if not (has_sums or has_csv):  # a point the run kept nothing of (runs kept before type sums: earlier points)
        return None
    with tempfile.TemporaryDirectory(dir=score_folder) as staging:
        staged = {}
        if has_sums and not is_kept_form(sums_path):
            staged[sums_path] = write_kept_type_sums(Path(staging) / sums_path.name, read_type_sums(sums_path).table,
                                                     scores["cross_fit"]["min_count"])
            check_cross_fitted_r(staged[sums_path], scores, num_towers)
        if has_csv:
            report, original = load_report(score_folder)
            if has_sums:
                converted, _ = per_token_table_of_sums(staged.get(sums_path, sums_path), report,
                                                       kept_tokenizer_file(run_dir))
            else:
                totals = score_folder / TYPE_TOTALS_PARQUET
                staged[totals] = write_type_totals(Path(staging) / totals.name, report, original)
                converted, _ = per_token_table_of_totals(staged[totals], report)
            check_same_table(converted, original, score_folder)
        for target, source in staged.items():
            source.replace(target)
    if not has_csv:
        return None
    held = revision_holding(csv_path, revision)
    if held is None and not has_sums:
        print(f"{csv_path}: kept (no revision {revision} holds it, and it is the only full record of its point): "
              "commit it, then run this script again.")
        return None
    data = csv_path.read_bytes()
    csv_path.unlink()
    if held is None:
        return None
    commit, repository_path = held
    return {"revision": commit, "repository_path": repository_path, "sha256": sha256_of(data)}


def convert_report_folder(report_dir, revision: str = "HEAD") -> list[dict]:
    """Convert every kept run of `report_dir` (its tokenizer into the shared folder, its points); returns the
    entries added to its full_tables.json."""
    report_dir = Path(report_dir)
    removed = []
    for run_dir in sorted(path.parent for path in (report_dir / "runs").glob(f"*/{RUN_SUMMARY}")):
        summary = json.loads((run_dir / RUN_SUMMARY).read_text(encoding="utf-8"))
        if share_tokenizer(run_dir, summary):
            print(f"{run_dir}: its tokenizer is now {kept_tokenizer_file(run_dir, summary)}")
        for score_folder, scores in point_folders(run_dir, summary):
            entry = convert_point(score_folder, scores, run_dir, summary["run"]["num_towers"], revision)
            if entry is not None:
                removed.append({"path": (score_folder / CSV_GZ).relative_to(report_dir).as_posix(), **entry})
    if removed:
        record_full_tables(report_dir, removed)
    return removed


def repack_figures(report_dir) -> list[Path]:
    """The report folder's figures saved before palette PNGs, written again as save_figure writes them; returns
    them (none where every figure is a palette PNG already)."""
    return [path for path in sorted(Path(report_dir).glob("*.png")) if repack_png(path)]


def archive_runs(report_dir: Path, revision: str) -> None:
    """--archive_runs: the tables removed and those kept, said."""
    archived, kept = archive_run_tables(report_dir, revision)
    for path in kept:
        print(f"{path}: kept (no revision {revision} holds it byte for byte): commit it, then run this script again.")
    print(f"{report_dir}: {len(archived)} run tables archived, each listed in {FULL_TABLES_JSON} with the revision "
          f"that holds it; {len(kept)} kept")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("report_dir", type=Path, help="a study's report folder (holding runs/RUN/run.json)")
    parser.add_argument("--revision", default="HEAD", help="the git revision that holds the CSVs, or with "
                        "--archive_runs the run tables (default HEAD)")
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--archive_runs", action="store_true", help="remove the runs' kept tables that the revision "
                        f"holds from the working tree, listing each in {FULL_TABLES_JSON}")
    action.add_argument("--restore_runs", action="store_true", help="write the archived run tables back from the "
                        "revision that holds each")
    args = parser.parse_args(argv)
    if args.archive_runs:
        archive_runs(args.report_dir, args.revision)
        return
    if args.restore_runs:
        try:
            restored = restore_run_tables(args.report_dir)
        except TwoTowerUserError as error:  # a clone without the revision, or a table not the one listed
            raise SystemExit(f"error: {error}") from None
        print(f"{args.report_dir}: {len(restored)} run tables written back from git, each checked against its sha256")
        return
    removed = convert_report_folder(args.report_dir, args.revision)
    figures = repack_figures(args.report_dir)
    print(f"{args.report_dir}: {len(figures)} figures written again as palette PNGs")
    print(f"{args.report_dir}: {len(removed)} per-token CSVs removed, each listed in full_tables.json with the "
          "revision that holds it")


if __name__ == "__main__":
    main()
