"""
The full per-token tables (gzipped CSVs) that a study's report folder no longer holds: its runs keep per-type sums
instead (kept_tables.py), and scripts/convert_kept_runs.py removed each table once a git revision held it. The folder's
FULL_TABLES_JSON names, per removed table, that revision and the table's path in the repository, so that

    git show REVISION:PATH > preference_per_token.csv.gz

gives it back byte for byte (its sha256 is checked), the document names the revision, and `--push_to_hub` stages the
tables into the study's Hub dataset (dataset.stage_dataset). A clone without that revision (`git clone --depth 1`)
fetches it first: `git fetch --depth 1 origin REVISION`.
"""

import hashlib
import json
import subprocess
from pathlib import Path

from twotower.training.utils.atomic import write_text_atomically
from twotower.training.utils.errors import TwoTowerUserError

FULL_TABLES_JSON = "full_tables.json"
ABOUT = ("Per-token tables (gzipped CSVs) that this folder's runs no longer keep (they keep per-type sums instead), "
         "each at the git revision that holds it: `git show REVISION:REPOSITORY_PATH`.")


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
    manifest = {"about": ABOUT, "tables": [tables[path] for path in sorted(tables)]}
    write_text_atomically(Path(report_dir) / FULL_TABLES_JSON, json.dumps(manifest, indent=2) + "\n")


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
        raise TwoTowerUserError(f"{entry['path']} read from revision {entry['revision']} is not the table "
                                f"{FULL_TABLES_JSON} names (sha256 {entry['sha256']}).")
    return data


def full_tables_note(report_dir: Path) -> dict | None:
    """What the document says of the removed tables: how many, the revisions holding them, one example path."""
    entries = read_full_tables(report_dir)
    if not entries:
        return None
    return {"count": len(entries), "runs": len({Path(entry["path"]).parts[1] for entry in entries}),
            "revisions": sorted({entry["revision"] for entry in entries}), "example": entries[0]["repository_path"],
            "manifest": FULL_TABLES_JSON}
