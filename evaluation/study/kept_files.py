"""
The study's kept files, checked as they are read, values included: each run's (REPORT_DIR/runs/RUN, and the tokenizer
its run.json names in REPORT_DIR/tokenizers), the convergence runs' (REPORT_DIR/convergence) and the part-of-speech
tags of each text (REPORT_DIR/type_tags). A file cut short or
damaged, a table without the columns its readers need, or a number that is NaN or infinite (the study writes none) is
named, with the run it belongs to, and set aside: that run alone is kept again or run again, a text tagged again; the
others stay. (The index of the kept tables, REPORT_DIR/run_index.parquet, is written anew by every aggregation;
scripts/recompute_study.py checks every table it reads, the index included.)
"""

import gzip
import json
import shutil
import zlib
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from twotower.training.utils.errors import TwoTowerUserError

from ..scoring.report_files import TYPE_SUMS_PARQUET
from .kept_tables import KEPT_TOKENIZER, RUN_SUMMARY, RUN_TOKENIZER_KEY, kept_tokenizer_file, tokenizer_digest

# What the readers need of each kind of kept table: its columns (a type_sums table also one logprob_sum_probe{k} per
# probe), and which of them hold numbers that must be finite (None: every numeric column).
KEPT_TABLES = {
    "type_sums": {"columns": ("half", "token_id", "count"), "finite": None},
    "type_tags": {"columns": ("token_id", "count", "tag", "agreement", "tagged"),
                  "finite": ("token_id", "count", "agreement")},
}  # fmt: skip
PROBE_SUMS_PREFIX = "logprob_sum_probe"


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number the study writes")


def json_problem(path: Path) -> str | None:
    """Why `path` is not a readable JSON object (missing, cut short, not UTF-8, NaN or infinity in it), or None."""
    try:
        value = json.loads(Path(path).read_text(encoding="utf-8"), parse_constant=_refuse_constant)
    except (OSError, UnicodeDecodeError, ValueError) as error:  # json.JSONDecodeError is a ValueError
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
    if path.name == KEPT_TOKENIZER:
        return _tokenizer_problem(path, data)
    return None


def _tokenizer_problem(path: Path, data: bytes) -> str | None:
    try:
        json.loads(data)
    except ValueError as error:
        return f"{path} does not hold a tokenizer ({error})"
    return None


def shared_tokenizer_problem(kept_dir: Path) -> str | None:
    """Why the report folder's tokenizer that a kept run's run.json names (REPORT_DIR/tokenizers/DIGEST.json.gz) is
    not one it can read (missing, damaged, or not the tokenizer its name says), or None (none named)."""
    summary = json.loads((kept_dir / RUN_SUMMARY).read_text(encoding="utf-8"))
    if not summary.get(RUN_TOKENIZER_KEY):
        return None
    path = kept_tokenizer_file(kept_dir, summary)
    if not path.is_file():
        return f"{path}, the tokenizer its {RUN_SUMMARY} names, is missing"
    problem = _gzip_problem(path)
    if problem is not None:
        return problem
    data = gzip.decompress(path.read_bytes())
    if path.name != f"{tokenizer_digest(data)}.json.gz":
        return f"{path} does not hold the tokenizer its name says (its sha256 begins {tokenizer_digest(data)})"
    return _tokenizer_problem(path, data)


def table_problem(path: Path, kind: str | None) -> str | None:
    """Why a kept Parquet table of `kind` (a key of KEPT_TABLES; None: any table, read whole) is not one its readers
    can use, or None."""
    try:
        table = pq.read_table(path).to_pandas()
    except Exception as error:  # noqa: BLE001 (pyarrow's errors have no common base but Exception)
        return f"{path} cannot be read ({' '.join(str(error).split())})"
    if kind is None:
        return None
    rules = KEPT_TABLES[kind]
    missing = [column for column in rules["columns"] if column not in table.columns]
    if kind == "type_sums" and not any(column.startswith(PROBE_SUMS_PREFIX) for column in table.columns):
        missing.append(f"{PROBE_SUMS_PREFIX}0")
    if missing:
        return f"{path} lacks the column(s) {missing} of a kept {kind} table (it holds {list(table.columns)})"
    numeric = table.select_dtypes("number")
    finite = numeric if rules["finite"] is None else numeric[[name for name in rules["finite"] if name in numeric]]
    not_finite = [column for column in finite.columns if not np.isfinite(finite[column].to_numpy(np.float64)).all()]
    if not_finite:
        return f"{path} holds NaN or infinite values in {not_finite}, which the study never writes"
    return None


def set_aside_damaged_table(path: Path, kind: str, redo: str) -> bool:
    """
    True when the kept table at `path` is damaged: it is named and renamed to .NAME.damaged beside it (replacing an
    earlier one; nothing deleted), so that it is made again (`redo` says how); False for a sound or missing file.
    """
    if not Path(path).is_file():
        return False
    problem = table_problem(path, kind)
    if problem is None:
        return False
    aside = Path(path).with_name(f".{Path(path).name}.damaged")
    print(f"The kept {kind} table is damaged ({problem}); it is set aside in {aside} and {redo}", flush=True)
    Path(path).replace(aside)
    return True


def kept_run_problem(kept_dir: Path) -> str | None:
    """The first damaged file of a kept run (run.json, each preference.json, table, sums, tokenizer, the shared
    tokenizer its run.json names), or None."""
    kept_dir = Path(kept_dir)
    for path in sorted(kept_dir.rglob("*")):
        if path.suffix == ".json":
            problem = json_problem(path)
        elif path.suffix == ".gz":
            problem = _gzip_problem(path)
        elif path.suffix == ".parquet":  # a run keeps its scored points' type_sums tables
            problem = table_problem(path, "type_sums" if path.name == TYPE_SUMS_PARQUET else None)
        else:
            problem = None
        if problem is not None:
            return problem
    return shared_tokenizer_problem(kept_dir) if (kept_dir / RUN_SUMMARY).is_file() else None


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
