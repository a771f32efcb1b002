"""
The full per-token tables (gzipped CSVs) that a study's report folder no longer holds: its runs keep per-type sums
instead (kept_tables.py), and scripts/convert_kept_runs.py removed each table once a git revision held it. The folder's
FULL_TABLES_JSON names, per removed table, that revision and the table's path in the repository, so that

    git show REVISION:PATH > preference_per_token.csv.gz

gives it back byte for byte (its sha256 is checked), the document names the revision, and `--push_to_hub` stages the
tables into the study's Hub dataset (dataset.stage_dataset). A clone without that revision (`git clone --depth 1`)
fetches it first: `git fetch --depth 1 origin REVISION`.

The same list holds the kept run tables (each scored point's type_sums.parquet or type_totals.parquet) of a folder
whose runs are archived: `archive_run_tables` removes from the working tree every one that a git revision holds byte
for byte and lists it (kind ARCHIVED_RUN_TABLE), `restore_run_tables` writes each back from its revision (its sha256
checked), so that the study aggregates the folder again; until then the study command refuses to aggregate it
(`check_run_tables_present`), and `--push_to_hub` stages them from their revision like the per-token tables
(scripts/convert_kept_runs.py REPORT_DIR --archive_runs, --restore_runs).
"""

import hashlib
import json
import subprocess
from pathlib import Path

from twotower.training.utils.atomic import write_atomically, write_text_atomically
from twotower.training.utils.errors import TwoTowerUserError

from ..scoring.report_files import TYPE_SUMS_PARQUET
from .kept_tables import TYPE_TOTALS_PARQUET

FULL_TABLES_JSON = "full_tables.json"
ABOUT = ("Per-token tables (gzipped CSVs) that this folder's runs no longer keep (they keep per-type sums instead), "
         "each at the git revision that holds it: `git show REVISION:REPOSITORY_PATH`.")
ABOUT_ARCHIVED = (" The tables of kind archived_run_table are kept run tables (per-type sums or totals) archived out "
                  "of the working tree: `python scripts/convert_kept_runs.py REPORT_DIR --restore_runs` writes them "
                  "back.")
ARCHIVED_RUN_TABLE = "archived_run_table"  # an entry's "kind"; an entry without one is a per-token CSV
KEPT_RUN_TABLES = (TYPE_SUMS_PARQUET, TYPE_TOTALS_PARQUET)


def _git(folder: Path, *arguments: str, binary: bool = False):
    """git's output (text, or bytes with `binary`) run in `folder`, or None where git fails (no repository, no such
    revision or file)."""
    try:
        done = subprocess.run(["git", "-C", str(folder), *arguments], capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout if binary else done.stdout.decode().strip()


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def revision_holding(path: Path, revision: str) -> tuple[str, str] | None:
    """(the commit `revision` names, the file's path in its repository) when that commit holds `path` byte for byte;
    None otherwise (not a repository, not committed, or changed since)."""
    path = Path(path).resolve()
    root = _git(path.parent, "rev-parse", "--show-toplevel")
    commit = _git(path.parent, "rev-parse", "--verify", f"{revision}^{{commit}}")
    if root is None or commit is None:
        return None
    repository_path = path.relative_to(Path(root).resolve()).as_posix()
    held = _git(path.parent, "rev-parse", f"{commit}:{repository_path}")
    is_held = held is not None and held == _git(path.parent, "hash-object", str(path))
    return (commit, repository_path) if is_held else None


def read_full_tables(report_dir: Path) -> list[dict]:
    """The entries of a report folder's FULL_TABLES_JSON (path in the folder, revision, repository_path, sha256)."""
    manifest = Path(report_dir) / FULL_TABLES_JSON
    return json.loads(manifest.read_text(encoding="utf-8"))["tables"] if manifest.is_file() else []


def record_full_tables(report_dir: Path, entries: list[dict]) -> None:
    """Add `entries` to the report folder's FULL_TABLES_JSON (an entry of the same path is replaced)."""
    tables = {entry["path"]: entry for entry in [*read_full_tables(report_dir), *entries]}
    about = ABOUT + (ABOUT_ARCHIVED if any(map(is_archived, tables.values())) else "")
    manifest = {"about": about, "tables": [tables[path] for path in sorted(tables)]}
    write_text_atomically(Path(report_dir) / FULL_TABLES_JSON, json.dumps(manifest, indent=2) + "\n")


def is_archived(entry: dict) -> bool:
    """Whether a FULL_TABLES_JSON entry is a kept run table archived out of the working tree (not a per-token CSV)."""
    return entry.get("kind") == ARCHIVED_RUN_TABLE


def per_token_tables(report_dir: Path) -> list[dict]:
    """The entries of the per-token CSVs the folder's runs no longer keep."""
    return [entry for entry in read_full_tables(report_dir) if not is_archived(entry)]


def archived_run_tables(report_dir: Path) -> list[dict]:
    """The entries of the kept run tables archived out of the working tree (whether or not restored since)."""
    return [entry for entry in read_full_tables(report_dir) if is_archived(entry)]


def missing_run_tables(report_dir: Path) -> list[dict]:
    """The archived run tables the working tree does not hold now."""
    return [entry for entry in archived_run_tables(report_dir) if not (Path(report_dir) / entry["path"]).is_file()]


def kept_run_tables(report_dir: Path) -> list[Path]:
    """Every kept run table in the working tree: each finished run's (runs/RUN with its run.json; not a run set
    aside as damaged, .RUN.damaged) type sums or type totals, at every point and text."""
    report_dir = Path(report_dir)
    runs = sorted(path.parent for path in (report_dir / "runs").glob("*/run.json")
                  if not path.parent.name.startswith("."))
    return sorted(path for run in runs for name in KEPT_RUN_TABLES for path in run.glob(f"**/{name}")
                  if not any(part.startswith(".") for part in path.relative_to(run).parts))


def _remove_empty_folders(folder: Path, stop: Path) -> None:
    """Remove `folder` and each parent up to (not including) `stop` that is left empty."""
    while folder != stop and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent


def archive_run_tables(report_dir: Path, revision: str = "HEAD") -> tuple[list[dict], list[Path]]:
    """
    Remove from the working tree every kept run table of `report_dir` that `revision` holds byte for byte (or that
    the revision FULL_TABLES_JSON names for it still holds: one restored earlier), after listing it there with that
    revision, its repository path and sha256 (kind ARCHIVED_RUN_TABLE). A table no such revision holds (not
    committed, or changed since) stays. Returns the entries of the tables removed and the paths of those kept; run
    again, it removes nothing and changes nothing.
    """
    report_dir = Path(report_dir)
    listed = {entry["path"]: entry for entry in archived_run_tables(report_dir)}
    archived, kept = [], []
    for path in kept_run_tables(report_dir):
        relative = path.relative_to(report_dir).as_posix()
        data = path.read_bytes()
        entry = listed.get(relative)
        if entry is None or entry["sha256"] != sha256_of(data) or revision_holding(path, entry["revision"]) is None:
            held = revision_holding(path, revision)
            if held is None:
                kept.append(path)
                continue
            entry = {"path": relative, "kind": ARCHIVED_RUN_TABLE, "revision": held[0], "repository_path": held[1],
                     "sha256": sha256_of(data)}
        archived.append(entry)
    if archived:  # listed first: a run interrupted after this holds tables that are listed, as after a restore
        record_full_tables(report_dir, archived)
    for entry in archived:
        (report_dir / entry["path"]).unlink()
        _remove_empty_folders((report_dir / entry["path"]).parent, report_dir / "runs")
    return archived, kept


def restore_run_tables(report_dir: Path) -> list[dict]:
    """
    Write back every archived run table the working tree lacks, read from the revision FULL_TABLES_JSON names and
    checked against its sha256 (full_table_bytes: a clone without the revision is told how to fetch it); returns
    their entries. FULL_TABLES_JSON is left as it is, so that archiving the folder again changes nothing.
    """
    report_dir = Path(report_dir)
    restored = []
    for entry in missing_run_tables(report_dir):
        target = report_dir / entry["path"]
        data = full_table_bytes(report_dir, entry)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, lambda tmp, data=data: Path(tmp).write_bytes(data))
        restored.append(entry)
    return restored


def check_run_tables_present(report_dir: Path) -> None:
    """Before a study aggregates `report_dir`: one error naming the folder and the restore command where its run
    tables are archived out of the working tree."""
    missing = missing_run_tables(report_dir)
    if missing:
        runs = len({Path(entry["path"]).parts[1] for entry in missing})
        raise TwoTowerUserError(
            f"The kept run tables of {report_dir} are archived out of the working tree ({len(missing)} tables of "
            f"{runs} runs, each listed in {Path(report_dir) / FULL_TABLES_JSON} with the git revision that holds it): "
            f"run `python scripts/convert_kept_runs.py {report_dir} --restore_runs` to write them back, then the "
            "study again.")


def full_table_bytes(report_dir: Path, entry: dict) -> bytes:
    """One removed table's bytes, from the working tree where it still is, else from its revision; checked."""
    local = Path(report_dir) / entry["path"]
    data = local.read_bytes() if local.is_file() else _git(
        Path(report_dir), "show", f"{entry['revision']}:{entry['repository_path']}", binary=True)
    if data is None:
        raise TwoTowerUserError(
            f"{entry['path']} of {report_dir} is kept at git revision {entry['revision']}, which this clone lacks "
            f"(a shallow clone?): run `git fetch --depth 1 origin {entry['revision']}` in the repository, then again.")
    if sha256_of(data) != entry["sha256"]:
        where = f"in {report_dir}" if local.is_file() else f"read from revision {entry['revision']}"
        raise TwoTowerUserError(f"{entry['path']} {where} is not the table {FULL_TABLES_JSON} names (sha256 "
                                f"{entry['sha256']}).")
    return data


def _tables_note(entries: list[dict]) -> dict:
    example = entries[0]
    return {"count": len(entries), "runs": len({Path(entry["path"]).parts[1] for entry in entries}),
            "revisions": sorted({entry["revision"] for entry in entries}), "example": example["repository_path"],
            "manifest": FULL_TABLES_JSON,
            # the folder's path in the repository, as the revisions hold it
            "folder": example["repository_path"].removesuffix(f"/{example['path']}")}


def full_tables_note(report_dir: Path) -> dict | None:
    """What the document says of the removed per-token tables (how many, the revisions holding them, one example
    path), and under "archived" the same of the archived run tables; None where the folder lists neither."""
    csvs, archived = per_token_tables(report_dir), archived_run_tables(report_dir)
    if not (csvs or archived):
        return None
    return {**(_tables_note(csvs) if csvs else {"count": 0}),
            "archived": _tables_note(archived) if archived else None}
