"""
The study's kept files (REPORT_DIR/runs/RUN and REPORT_DIR/convergence), checked as they are read: a file cut short
or damaged is named, with the run it belongs to, and that run alone is kept again or run again; the others stay.
"""

import gzip
import json
import shutil
import zlib
from pathlib import Path

import pyarrow.parquet as pq

from twotower.training.utils.errors import TwoTowerUserError


def json_problem(path: Path) -> str | None:
    """Why `path` is not a readable JSON object (missing, cut short, not UTF-8), or None."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{path} cannot be read ({error})"
    return None if isinstance(value, dict) else f"{path} does not hold a JSON object"


def read_kept_json(path: Path, fix: str) -> dict:
    """A kept JSON file; a damaged one is one error naming it and `fix`."""
    problem = json_problem(path)
    if problem is not None:
        raise TwoTowerUserError(f"{problem}: it is damaged or cut short; {fix}")
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _gzip_problem(path: Path) -> str | None:
    try:
        data = gzip.decompress(path.read_bytes())  # its CRC and length are checked at the end
    except (OSError, EOFError, zlib.error) as error:
        return f"{path} cannot be read ({error})"
    if path.name == "tokenizer.json.gz":
        try:
            json.loads(data)
        except ValueError as error:
            return f"{path} does not hold a tokenizer ({error})"
    return None


def _parquet_problem(path: Path) -> str | None:
    try:
        pq.read_table(path)
    except Exception as error:  # noqa: BLE001 (pyarrow's errors have no common base but Exception)
        return f"{path} cannot be read ({error})"
    return None


def kept_run_problem(kept_dir: Path) -> str | None:
    """The first damaged file of a kept run (run.json, each preference.json, table, sums, tokenizer), or None."""
    kept_dir = Path(kept_dir)
    for path in sorted(kept_dir.rglob("*")):
        if path.suffix == ".json":
            problem = json_problem(path)
        elif path.suffix == ".gz":
            problem = _gzip_problem(path)
        elif path.suffix == ".parquet":
            problem = _parquet_problem(path)
        else:
            problem = None
        if problem is not None:
            return problem
    return None


def set_aside_if_damaged(kept_dir: Path, label: str) -> bool:
    """
    True when a kept run has a damaged file: it is named, and the folder renamed to .RUN.damaged beside it (replacing
    an earlier one), so that the run is kept again from OUTPUT_DIR or run again; the other kept runs are untouched.
    """
    problem = kept_run_problem(kept_dir)
    if problem is None:
        return False
    aside = kept_dir.with_name(f".{kept_dir.name}.damaged")
    print(f"{label} {kept_dir.name}: its kept results are damaged ({problem}); they are set aside in {aside}, and "
          "the run is kept again (or run again)", flush=True)
    if aside.exists():
        shutil.rmtree(aside)
    kept_dir.replace(aside)
    return True


def check_kept_run(kept_dir: Path) -> None:
    """Before the document reads a kept run: one error naming its damaged file and how to redo that run alone."""
    problem = kept_run_problem(kept_dir)
    if problem is not None:
        raise TwoTowerUserError(
            f"The kept results of run {kept_dir.name} are damaged: {problem}. Run the study again with "
            f"--runs '^{kept_dir.name}$' to keep them again (or rerun that run); the other runs stay as kept."
        )
