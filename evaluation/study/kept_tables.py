"""
What the study keeps of each scored point of a run, and the per-token tables its documents read, from that alone.

A run keeps, in REPORT_DIR/runs/RUN (driver.keep_run_results):

- at its last point, per scored text (scores/TEXT/): preference.json and type_sums.parquet in the kept form of
  scoring/type_sums.py (counts, the probes' sums, the sums of squares and the ablation's sums per half and type),
  from which, with the run's tokenizer, the scoring command's per-token table is recomputed;
- at each earlier trajectory point (trajectory/step-S/scores/TEXT/): type_sums.parquet with the counts and the
  probes' sums alone, what the cross-fitted figures read of it (no per-token table is read there).

The runs' tokenizers are kept once per report folder, each distinct one in REPORT_DIR/tokenizers/DIGEST.json.gz
(gzipped tokenizer.json; DIGEST, `tokenizer_digest`: the first 12 hex digits of its sha256, which also names the
texts' tags under it, parts_of_speech.type_tags_path); a run's run.json names its file (RUN_TOKENIZER_KEY, the path
relative to the report folder). A run kept before that keeps its own copy, runs/RUN/tokenizer.json.gz (KEPT_TOKENIZER),
which `kept_tokenizer_file` reads as well; scripts/convert_kept_runs.py moves it into the shared folder.

A run scored before the sums were kept (no type_sums.parquet) keeps, in place of its per-token CSV, type_totals.parquet
(TYPE_TOTALS_PARQUET): per eligible type its token string, count and every probe's summed log-probability over the
whole text, and the ablation's preference where it has one; the totals over all types in the metadata, as for type
sums. Its replica-level columns are recomputed from those sums as the scoring computed them; its occurrence-level
and ablation p-values are not (the full CSVs stay in git history and the Hub dataset: scripts/convert_kept_runs.py).

`load_kept_report(score_folder)` reads any of these, or a per-token CSV (the scoring command's, and the study's kept
before this form), as a KeptReport.
"""

import gzip
import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer

from twotower.training.utils.atomic import write_atomically

from ..scoring.report import load_report, numbered_columns, tower_columns
from ..scoring.report_files import PER_TOKEN_CSV, PREFERENCE_JSON, TYPE_SUMS_PARQUET
from ..scoring.type_sums import (
    METADATA_KEY, PROBE_SUMS, ZSTD_LEVEL, TypeSums, per_token_table_from_sums, read_type_sums, write_kept_type_sums,
)

TYPE_TOTALS_PARQUET = "type_totals.parquet"
KEPT_TOKENIZER = "tokenizer.json.gz"  # a run's own tokenizer, as runs kept before the shared folder keep it
KEPT_TOKENIZERS_DIR = "tokenizers"  # REPORT_DIR/tokenizers/DIGEST.json.gz: each distinct tokenizer once
RUN_TOKENIZER_KEY = "kept_tokenizer"  # run.json: its tokenizer's file, relative to the report folder
RUN_SUMMARY = "run.json"
# what an earlier trajectory point keeps of its sums: what the cross-fitted figures (and the cross-seed r) read
TRAJECTORY_COLUMNS = ("half", "token_id", "count")


@dataclass
class KeptReport:
    """A kept score folder as the documents read it."""

    report: dict  # preference.json
    table: pd.DataFrame  # the per-token table (report.per_token_table's columns): every type, or the eligible ones
    # [probes] each probe's mean log-prob over all predictions, rare types included; None where the table lists every
    # type (a CSV), whose rows give it
    probe_mean_logprob: np.ndarray | None


def _probe_means_of_totals(sums: TypeSums) -> np.ndarray:
    return sums.totals[sums.columns(PROBE_SUMS)].sum().to_numpy() / sums.totals["count"].sum()


def _run_folder(score_folder: Path) -> Path:
    """The kept run folder (the one with run.json) above a score folder of any of its points."""
    return next(folder for folder in score_folder.parents if (folder / RUN_SUMMARY).is_file())


def tokenizer_digest(tokenizer_json: bytes) -> str:
    """The name the study gives a tokenizer: the first 12 hex digits of its tokenizer.json's sha256 (of its kept
    file, and of the texts' tags under it)."""
    return hashlib.sha256(tokenizer_json).hexdigest()[:12]


def kept_tokenizer_path(report_dir, tokenizer_json: bytes) -> Path:
    """Where a report folder keeps a tokenizer: REPORT_DIR/tokenizers/DIGEST.json.gz."""
    return Path(report_dir, KEPT_TOKENIZERS_DIR, f"{tokenizer_digest(tokenizer_json)}.json.gz")


def read_kept_tokenizer(path) -> bytes | None:
    """The tokenizer.json a kept (gzipped) tokenizer file holds, or None where it is missing or damaged."""
    try:
        return gzip.decompress(Path(path).read_bytes())
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error):
        return None


def keep_tokenizer(report_dir, tokenizer_json: bytes) -> str:
    """
    Keep a tokenizer in the report folder once (kept_tokenizer_path; gzipped, written atomically), and return its
    path relative to the report folder, what a run's run.json names (RUN_TOKENIZER_KEY). A file already there is
    left as it is where it holds these bytes, and written again where it does not (damaged, cut short).
    """
    path = kept_tokenizer_path(report_dir, tokenizer_json)
    if read_kept_tokenizer(path) != tokenizer_json:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: Path(tmp).write_bytes(gzip.compress(tokenizer_json, mtime=0)))
    return path.relative_to(report_dir).as_posix()


def kept_tokenizer_file(run_dir, summary: dict | None = None) -> Path:
    """A kept run's tokenizer file: the report folder's that its run.json (`summary`, read from run_dir where not
    given) names, or, for a run kept before the shared folder, its own runs/RUN/tokenizer.json.gz (neither file need
    exist: a run kept without a tokenizer)."""
    run_dir = Path(run_dir)
    if summary is None:
        summary = json.loads((run_dir / RUN_SUMMARY).read_text(encoding="utf-8"))
    name = summary.get(RUN_TOKENIZER_KEY)
    return run_dir.parent.parent / name if name else run_dir / KEPT_TOKENIZER


def tokens_of_kept_tokenizer(path: Path):
    """tokens_of(ids) -> token strings, from a run's gzipped tokenizer.json (the strings the scoring command wrote:
    transformers' convert_ids_to_tokens reads them from the same file)."""
    tokenizer = Tokenizer.from_str(gzip.decompress(Path(path).read_bytes()).decode("utf-8"))
    return lambda ids: [tokenizer.id_to_token(token_id) for token_id in ids]


def read_type_totals(path: Path) -> tuple[TypeSums, list[str], pd.DataFrame]:
    """(the sums of a type_totals.parquet as TypeSums, one half holding the whole text; its token strings; its
    ablation preference columns, empty without the ablation)."""
    frame = pq.read_table(path).to_pandas()
    metadata = json.loads(pq.read_schema(path).metadata[METADATA_KEY])
    ablation = frame[[column for column in frame.columns if column.startswith("ablation_preference_nats_tower")]]
    sums = frame.drop(columns=["token", *ablation.columns]).assign(half=np.int8(0))
    sums = sums.astype({column: "float64" for column in sums.columns if column.startswith(PROBE_SUMS)})
    totals = pd.DataFrame(metadata["totals"], index=[0])
    return TypeSums(sums, totals, metadata["min_count"]), frame["token"].tolist(), ablation


def per_token_table_of_sums(sums_path: Path, report: dict, tokenizer_file: Path) -> tuple[pd.DataFrame, np.ndarray]:
    """(the per-token table recomputed from a type_sums.parquet and the run's tokenizer, each probe's mean log-prob
    over all predictions)."""
    sums = read_type_sums(sums_path)
    table = per_token_table_from_sums(sums, report, tokens_of_kept_tokenizer(tokenizer_file))
    return table, _probe_means_of_totals(sums)


def per_token_table_of_totals(totals_path: Path, report: dict) -> tuple[pd.DataFrame, np.ndarray]:
    """(the per-token table recomputed from a type_totals.parquet, each probe's mean log-prob over all
    predictions)."""
    sums, tokens, ablation = read_type_totals(totals_path)
    by_id = dict(zip(sums.table["token_id"].tolist(), tokens))
    table = per_token_table_from_sums(sums, report, lambda ids: [by_id[token_id] for token_id in ids])
    if not ablation.empty:  # the ablation's columns as kept (two towers: tower 0's; tower 1's is its negative)
        values = ablation.to_numpy(np.float64).T
        values = np.concatenate([values, -values]) if report["summary"]["num_towers"] == 2 else values
        table = table.assign(**{f"ablation_preference_nats_tower{tower}": row for tower, row in enumerate(values)})
    return table, _probe_means_of_totals(sums)


def load_kept_report(score_folder) -> KeptReport:
    """A kept score folder's report and per-token table: its CSV where it has one, else recomputed from its
    type_sums.parquet (with the run's tokenizer) or its type_totals.parquet."""
    score_folder = Path(score_folder)
    has_csv = any((score_folder / name).is_file() for name in (PER_TOKEN_CSV, f"{PER_TOKEN_CSV}.gz"))
    if has_csv or not (score_folder / PREFERENCE_JSON).is_file():
        return KeptReport(*load_report(score_folder), None)  # a missing report is its error
    report = json.loads((score_folder / PREFERENCE_JSON).read_text(encoding="utf-8"))
    if (score_folder / TYPE_SUMS_PARQUET).is_file():
        tokenizer_file = kept_tokenizer_file(_run_folder(score_folder))
        return KeptReport(report, *per_token_table_of_sums(score_folder / TYPE_SUMS_PARQUET, report, tokenizer_file))
    return KeptReport(report, *per_token_table_of_totals(score_folder / TYPE_TOTALS_PARQUET, report))


def write_type_totals(path: Path, report: dict, table: pd.DataFrame) -> Path:
    """
    type_totals.parquet of a per-token table (the CSV of a run scored before type sums were kept): its eligible types'
    token, count, probe sums (mean log-prob times count) and ablation preference (two towers: tower 0's), float32;
    the metadata holds min_count and the totals over every type of the table.
    """
    probe_means = numbered_columns(table, "probe_mean_logprob_probe")  # [probes, types] float64
    count = table["count"].to_numpy()
    eligible = table["eligible"].to_numpy(dtype=bool)
    columns = {"token_id": table["token_id"].to_numpy()[eligible].astype(np.int32),
               "token": table["token"].astype(str).to_numpy()[eligible], "count": count[eligible].astype(np.int32)}
    sums = probe_means * count  # [probes, types]
    for probe, values in enumerate(sums):
        columns[f"{PROBE_SUMS}{probe}"] = values[eligible].astype(np.float32)
    if "ablation_preference_nats_tower0" in table:
        ablation = tower_columns(table, "ablation_preference_nats")
        for tower, values in enumerate(ablation[:1] if ablation.shape[0] == 2 else ablation):
            columns[f"ablation_preference_nats_tower{tower}"] = values[eligible].astype(np.float32)
    totals = {"count": [int(count.sum())], **{f"{PROBE_SUMS}{probe}": [float(values.sum())]
                                               for probe, values in enumerate(sums)}}
    metadata = {"min_count": int(report["settings"]["min_count"]), "totals": totals}
    arrow = pa.Table.from_pandas(pd.DataFrame(columns), preserve_index=False)
    arrow = arrow.replace_schema_metadata({**arrow.schema.metadata, METADATA_KEY: json.dumps(metadata).encode()})
    floats = [field.name for field in arrow.schema if pa.types.is_floating(field.type)]
    return write_atomically(path, lambda tmp: pq.write_table(
        arrow, tmp, compression="zstd", compression_level=ZSTD_LEVEL, use_dictionary=["token"],
        use_byte_stream_split=floats))


def keep_point_sums(source: Path, kept: Path, min_count: int, is_last: bool) -> None:
    """A scored point's type_sums.parquet (the scoring command's) kept in the study's form: every column at the last
    point, the counts and probe sums (TRAJECTORY_COLUMNS and the probes') at an earlier one."""
    table = pd.read_parquet(source)
    if not is_last:
        table = table[[*TRAJECTORY_COLUMNS, *(column for column in table if column.startswith(PROBE_SUMS))]]
    kept.parent.mkdir(parents=True, exist_ok=True)
    write_kept_type_sums(kept, table, min_count)
