"""A report folder's kept run tables archived out of the working tree (scripts/convert_kept_runs.py --archive_runs):
each table that a git revision holds byte for byte leaves, listed in full_tables.json with that revision and its
sha256; --restore_runs writes every one back byte for byte; running either again changes nothing; a table no
revision holds stays; the study refuses to aggregate the folder until restored, recompute_study.py says the same, and
the Hub dataset staged from the folder holds every table, read from git."""

import hashlib
import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pandas as pd
import pytest
from test_study_factorial import planted_study, study_of

from twotower.evaluation.study.dataset import RUN_INDEX_PARQUET, stage_dataset, write_dataset_card
from twotower.evaluation.scoring.report import template_environment
from twotower.evaluation.study.document import TEMPLATES_DIR, render_template
from twotower.evaluation.study.driver import run_study
from twotower.evaluation.study.full_tables import FULL_TABLES_JSON, full_tables_note, read_full_tables
from twotower.evaluation.study.kept_files import kept_run_problem
from twotower.training.utils.errors import TwoTowerUserError

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def git(folder, *arguments) -> str:
    return subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, check=True, text=True).stdout


def folder_bytes(folder: Path) -> dict:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


def tables_of(files: dict) -> dict:
    return {path: data for path, data in files.items() if path.endswith(("type_sums.parquet", "type_totals.parquet"))}


@pytest.fixture
def committed_study(tmp_path):
    """A study folder of four kept runs (type sums at two points each, the earlier one in trajectory/step-3) with
    its index, dataset card and a per-token CSV listed before, committed in a git repository."""
    repository = tmp_path / "repository"
    report_dir = repository / "docs" / "study"
    summaries = planted_study(report_dir / "runs", lambda c, e: 0.5, seeds=1)
    # a run scored before type sums keeps its type totals (any Parquet table stands for one here)
    totals = report_dir / "runs" / summaries[0]["run"]["name"] / "scores" / "gutenberg" / "type_totals.parquet"
    totals.parent.mkdir(parents=True)
    pd.DataFrame({"token_id": [1, 2], "count": [3, 4]}).to_parquet(totals)
    csv = {"path": "runs/old/scores/wiki/preference_per_token.csv.gz", "revision": "0" * 40,
           "repository_path": "docs/study/runs/old/scores/wiki/preference_per_token.csv.gz", "sha256": "0" * 64}
    (report_dir / FULL_TABLES_JSON).write_text(json.dumps({"about": "", "tables": [csv]}))
    write_dataset_card(summaries, report_dir, study_of(), render_template)
    git(repository, "init", "-q")
    git(repository, "add", ".")
    git(repository, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "study")
    return {"repository": repository, "report_dir": report_dir, "summaries": summaries,
            "commit": git(repository, "rev-parse", "HEAD").strip()}


def test_archived_tables_leave_and_come_back_byte_for_byte(committed_study, capsys):
    convert = load_script("convert_kept_runs")
    report_dir, commit = committed_study["report_dir"], committed_study["commit"]
    before = folder_bytes(report_dir)
    tables = tables_of(before)
    assert len(tables) == 9  # four runs at two points, and one run's type totals

    convert.main([str(report_dir), "--archive_runs"])
    assert "9 run tables archived" in capsys.readouterr().out
    after = folder_bytes(report_dir)
    assert tables_of(after) == {}
    # only the tables left; the document's files, run.json files and the index stay, byte for byte
    assert {path: data for path, data in after.items() if path != FULL_TABLES_JSON} == {
        path: data for path, data in before.items() if path not in tables and path != FULL_TABLES_JSON}
    assert not list(report_dir.glob("runs/*/trajectory"))  # a folder that held a table alone goes with it
    archived = [entry for entry in read_full_tables(report_dir) if entry.get("kind") == "archived_run_table"]
    assert sorted(entry["path"] for entry in archived) == sorted(tables)
    for entry in archived:  # each entry gives its table back from git on its own, independently of the package
        revision_path = f"{entry['revision']}:{entry['repository_path']}"
        shown = subprocess.run(["git", "-C", str(report_dir), "show", revision_path], capture_output=True,
                               check=True).stdout
        assert entry["revision"] == commit and shown == tables[entry["path"]]
        assert entry["sha256"] == hashlib.sha256(shown).hexdigest()
    # the per-token CSV listed before keeps its entry
    assert [entry["path"] for entry in read_full_tables(report_dir) if "kind" not in entry] == [
        "runs/old/scores/wiki/preference_per_token.csv.gz"]
    for run in (report_dir / "runs").iterdir():  # a run's checks read what it keeps, not what it archived
        assert kept_run_problem(run) is None

    # again: nothing changes
    archived_state = folder_bytes(report_dir)
    convert.main([str(report_dir), "--archive_runs"])
    assert "0 run tables archived" in capsys.readouterr().out
    assert folder_bytes(report_dir) == archived_state

    convert.main([str(report_dir), "--restore_runs"])
    assert "9 run tables written back" in capsys.readouterr().out
    assert tables_of(folder_bytes(report_dir)) == tables
    assert folder_bytes(report_dir) == {**archived_state, **tables}
    convert.main([str(report_dir), "--restore_runs"])  # again: nothing to write
    assert "0 run tables written back" in capsys.readouterr().out

    # archived again after the restore: the same list, the same files gone (a later commit holds the same bytes)
    git(committed_study["repository"], "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
        "--allow-empty", "-m", "later")
    convert.main([str(report_dir), "--archive_runs"])
    assert folder_bytes(report_dir) == archived_state


def test_a_table_no_revision_holds_stays(committed_study, capsys):
    convert = load_script("convert_kept_runs")
    report_dir = committed_study["report_dir"]
    changed = next(report_dir.glob("runs/*/scores/wiki/type_sums.parquet"))
    changed.write_bytes(changed.read_bytes() + b"\0")  # changed since the commit
    new = report_dir / "runs" / "new-run" / "scores" / "wiki" / "type_sums.parquet"  # never committed
    new.parent.mkdir(parents=True)
    shutil.copyfile(changed, new)
    (new.parent.parent.parent / "run.json").write_text("{}")

    archived, kept = convert.archive_run_tables(report_dir, "HEAD")
    assert kept == sorted([changed, new])
    assert "commit it, then run this script again" not in capsys.readouterr().out
    assert changed.is_file() and new.is_file()
    assert {entry["path"] for entry in archived} == {entry["path"] for entry in read_full_tables(report_dir)
                                                     if entry.get("kind")}
    assert changed.relative_to(report_dir).as_posix() not in {entry["path"] for entry in archived}

    convert.main([str(report_dir), "--archive_runs"])
    assert f"{new}: kept (no revision HEAD holds it byte for byte): commit it" in capsys.readouterr().out
    # committed, it goes too
    git(committed_study["repository"], "add", ".")
    git(committed_study["repository"], "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "more")
    archived, kept = convert.archive_run_tables(report_dir, "HEAD")
    assert kept == [] and sorted(entry["path"] for entry in archived) == sorted(
        path.relative_to(report_dir).as_posix() for path in (changed, new))


def test_the_study_refuses_to_aggregate_an_archived_folder_until_restored(committed_study, tmp_path):
    convert = load_script("convert_kept_runs")
    report_dir = committed_study["report_dir"]
    convert.archive_run_tables(report_dir, "HEAD")
    with pytest.raises(TwoTowerUserError) as refused:  # before any run: a recipe and data it never reaches
        run_study("no-such-recipe", tmp_path / "no-data", tmp_path / "out", report_dir, aggregate_only=True)
    message = str(refused.value)
    assert str(report_dir) in message and "9 tables of 4 runs" in message
    assert f"python scripts/convert_kept_runs.py {report_dir} --restore_runs" in message
    recompute = load_script("recompute_study")
    with pytest.raises(SystemExit, match=r"--restore_runs` writes them back\.$"):
        recompute.main([str(report_dir)])
    convert.restore_run_tables(report_dir)
    with pytest.raises(Exception) as other:  # restored: the study goes on, to the recipe it cannot find
        run_study("no-such-recipe", tmp_path / "no-data", tmp_path / "out", report_dir, aggregate_only=True)
    assert "--restore_runs" not in str(other.value)


def test_a_shallow_clone_is_told_which_revision_to_fetch(committed_study, tmp_path):
    convert = load_script("convert_kept_runs")
    repository = committed_study["repository"]
    convert.archive_run_tables(committed_study["report_dir"], "HEAD")
    git(repository, "add", "-A")
    git(repository, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "archived")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repository}", str(clone)], check=True)
    with pytest.raises(SystemExit, match=f"^error: .* run `git fetch --depth 1 origin {committed_study['commit']}`"):
        convert.main([str(clone / "docs" / "study"), "--restore_runs"])
    git(clone, "fetch", "-q", "--depth", "1", "origin", committed_study["commit"])
    assert len(convert.restore_run_tables(clone / "docs" / "study")) == 9


def test_the_card_index_and_hub_copy_of_an_archived_folder_hold_every_table(committed_study, tmp_path):
    convert = load_script("convert_kept_runs")
    report_dir, summaries = committed_study["report_dir"], committed_study["summaries"]
    tables = tables_of(folder_bytes(report_dir))
    index = (report_dir / RUN_INDEX_PARQUET).read_bytes()
    convert.archive_run_tables(report_dir, "HEAD")

    # the card written again while archived: the same index, and the card says where the tables are
    write_dataset_card(summaries, report_dir, study_of(), render_template)
    assert (report_dir / RUN_INDEX_PARQUET).read_bytes() == index
    card = (report_dir / "README.md").read_text()
    assert "leaves out this folder's 9 run tables (the per-type sums\n  or totals of 4 runs)" in card
    assert f"`{committed_study['commit']}`" in card
    assert "`python scripts/convert_kept_runs.py docs/study --restore_runs` writes them back" in card
    # the per-token CSVs' configuration lists the CSVs alone
    assert "- config_name: full_tables\n  data_files:\n  - split: old.wiki\n" in card
    assert card.count("preference_per_token.csv.gz") == 1

    # staged for the Hub: every table, from git (the listed CSV aside: no revision of this repository holds it)
    manifest = json.loads((report_dir / FULL_TABLES_JSON).read_text())
    manifest["tables"] = [entry for entry in manifest["tables"] if entry.get("kind")]
    (report_dir / FULL_TABLES_JSON).write_text(json.dumps(manifest))
    staged = stage_dataset(report_dir, tmp_path / "staged")
    assert tables_of(folder_bytes(staged)) == tables

    # the document's note names them; what it says of the per-token CSVs stays where the folder lists some
    note = full_tables_note(report_dir)
    assert note["count"] == 0 and note["archived"]["count"] == 9 and note["archived"]["runs"] == 4
    section = note_section(note)
    assert "Those kept run tables (9 of 4 runs) are archived out of the git working tree" in section
    assert f"`git show {committed_study['commit']}:docs/study/runs/" in section and "gzipped CSVs" not in section
    assert "`python scripts/convert_kept_runs.py docs/study --restore_runs`" in section
    csv_only = {**note_of_csvs(), "archived": None}
    assert "3 gzipped CSVs of 2 runs" in note_section(csv_only) and "archived" not in note_section(csv_only)
    assert "3 gzipped CSVs of 2 runs" in note_section({**note_of_csvs(), "archived": note["archived"]})


def note_of_csvs():
    return {"count": 3, "runs": 2, "revisions": ["a" * 40], "example": "docs/study/runs/x/scores/wiki/t.csv.gz",
            "manifest": FULL_TABLES_JSON}


def note_section(full_tables) -> str:
    """The document template's section on where the tables are, rendered alone."""
    source = (TEMPLATES_DIR / "study.md.j2").read_text()
    section = source[source.rindex("{% if full_tables %}"):]
    return template_environment(TEMPLATES_DIR).from_string(section).render(full_tables=full_tables)
