"""
A scored point's per-type sums (cross_fitting.CrossFittedPreference.type_sums), kept small, and the report's
per-type figures recomputed from them.

Every column of a report's per-token table (report.per_token_table) is a function of a few sums per token type: its
count, each probe's summed gold log-probability, the summed squares of each tower's per-occurrence preference and,
with the ablation, each tower's summed increase and the summed squares of its contrast. `preference_results` puts
those sums back into the accumulators the scoring command fed (ReplicaPreferenceAccumulator; a PreferenceAccumulator
for the ablation) and computes their results with the same code, so `per_token_table_from_sums` is the scoring
command's table, to float rounding.

What a study keeps of a point (`write_kept_type_sums`, read back by `read_type_sums`):

- the rows of the token types seen at least `min_count` times over the whole text, the only types that any per-type
  statistic reads (they are the eligible ones; the cross-fitted correlations need min_count in each half);
- the sums as float32: 6e-8 relative, which moves a cross-fitted r by at most 2e-7 and a per-type preference by
  about 1e-6 nats (the documents print 3 decimals); counts and ids as integers. The figures that read a variance move
  more, since a variance is a difference of sums: the occurrence-level one (a sum of squares less a squared sum
  over the count; a p-value of 0.331 by 1e-4 relative in a test's small model) and, where replicas nearly agree,
  the replica-level one (a micro study's 2 runs: its p-values by up to 4e-3 relative; the study's runs: within
  1e-5);
- in the Parquet file's metadata (key METADATA_KEY): that min_count, and every sum column's total per half over all
  predictions, rare types included, in float64 (centered preferences are taken relative to each probe's mean over
  all predictions);
- zstd, with the floats' bytes split into streams (Parquet's BYTE_STREAM_SPLIT), which compresses them best.

    write_kept_type_sums("runs/RUN/scores/TEXT/type_sums.parquet", cross_fit.type_sums(), min_count=10)
    sums = read_type_sums("runs/RUN/scores/TEXT/type_sums.parquet")
    table = per_token_table_from_sums(sums, report, tokens_of)  # report: the point's preference.json
"""

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from twotower.training.utils.atomic import write_atomically

from ..tower_preference.preference_stats import PreferenceAccumulator, tower_contrast
from ..tower_preference.replica_preference import ReplicaPreferenceAccumulator
from .report import per_token_table

METADATA_KEY = b"twotower.type_sums"
PROBE_SUMS = "logprob_sum_probe"
PREFERENCE_SQUARES = "preference_sq_sum_tower"
ABLATION_SUMS = "ablation_increase_sum_tower"
ABLATION_SQUARES = "ablation_preference_sq_sum_tower"
SUM_PREFIXES = (PROBE_SUMS, PREFERENCE_SQUARES, ABLATION_SUMS, ABLATION_SQUARES)
# the per-token columns that need the sums of squares: without them (a run kept before it had them) they are left out
OCCURRENCE_COLUMNS = ("occurrence_p_value", "occurrence_significant")
ABLATION_TEST_COLUMNS = ("ablation_p_value", "ablation_significant")
KEPT_INTEGERS = {"half": "int8", "token_id": "int32", "count": "int32"}
ZSTD_LEVEL = 19  # level 22 gains nothing on these tables


@dataclass
class TypeSums:
    """A type_sums table (float64 sums), with what it needs to stand for the whole text."""

    table: pd.DataFrame  # one row per half and token type: half, token_id, count, the SUM_PREFIXES columns
    totals: pd.DataFrame  # one row per half (index 0, 1): count and every sum column over all predictions
    min_count: int  # the table holds every type seen at least this often over the whole text (1: every type)

    def columns(self, prefix: str) -> list[str]:
        """The table's columns `prefix`0, `prefix`1, ... in order."""
        count = sum(column.startswith(prefix) and column[len(prefix):].isdigit() for column in self.table.columns)
        return [f"{prefix}{index}" for index in range(count)]


def sum_columns(table: pd.DataFrame) -> list[str]:
    return [column for column in table.columns if column.startswith(SUM_PREFIXES)]


def kept_type_sums(type_sums: pd.DataFrame, min_count: int) -> pa.Table:
    """The Arrow table a study keeps of `type_sums` (the module docstring): the rows of the types seen at least
    `min_count` times, float32 sums, and the totals per half over all rows in the metadata."""
    totals = type_sums.groupby("half")[["count", *sum_columns(type_sums)]].sum()
    type_count = type_sums.groupby("token_id")["count"].transform("sum")
    kept = type_sums[type_count >= min_count].sort_values(["half", "token_id"])
    kept = kept.astype({**KEPT_INTEGERS, **{column: "float32" for column in sum_columns(kept)}})
    metadata = {"min_count": int(min_count),
                "totals": {column: totals[column].tolist() for column in totals.columns},
                "halves": totals.index.tolist()}
    table = pa.Table.from_pandas(kept, preserve_index=False)
    return table.replace_schema_metadata({**table.schema.metadata, METADATA_KEY: json.dumps(metadata).encode()})


def write_kept_type_sums(path, type_sums: pd.DataFrame, min_count: int) -> Path:
    """Write what a study keeps of `type_sums` (kept_type_sums) to `path`, zstd with the floats' bytes split."""
    table = kept_type_sums(type_sums, min_count)
    floats = [field.name for field in table.schema if pa.types.is_floating(field.type)]
    return write_atomically(path, lambda tmp: pq.write_table(
        table, tmp, compression="zstd", compression_level=ZSTD_LEVEL, use_dictionary=False,
        use_byte_stream_split=floats))


def read_type_sums(path) -> TypeSums:
    """A type_sums.parquet as the scoring command writes it (every type, float64) or as a study keeps it."""
    table = pq.read_table(path)
    metadata = json.loads((table.schema.metadata or {}).get(METADATA_KEY, b"null"))
    frame = table.to_pandas()
    frame = frame.astype({column: "float64" for column in sum_columns(frame)})
    if metadata is None:  # the scoring command's: its rows are the whole text
        return TypeSums(frame, frame.groupby("half")[["count", *sum_columns(frame)]].sum(), 1)
    totals = pd.DataFrame(metadata["totals"], index=metadata["halves"])
    return TypeSums(frame, totals, metadata["min_count"])


def _per_type(sums: TypeSums, columns: list[str], token_ids: np.ndarray) -> np.ndarray:
    """[len(columns), types] the columns summed over halves, per type of `token_ids`."""
    per_type = sums.table.groupby("token_id")[columns].sum().reindex(token_ids)
    return per_type.to_numpy().T


def preference_results(sums: TypeSums, report: dict):
    """
    (the probes' PreferenceResult, the ablation's or None) that the scoring command computed for the point whose
    preference.json is `report` (its probe layout, settings and summary), recomputed from its sums; their summary is
    the report's. Where the table lacks sums of squares (a run kept before them), the figures that need them are None:
    the occurrence-level test's (occurrence_standard_error, occurrence_p_value, occurrence_significant) and the
    ablation's p_value and significant.

    The accumulators get the per-type sums in one of their halves (their halves are occurrence parity, which only the
    summary's split-half figure reads; the results' per-type arrays do not). The scoring centered each probe on its
    mean over all predictions; a kept table lacks the rare types, so the sums are taken relative to the totals' means
    here and computed uncentered, which gives the same per-type figures, and the means are added back to the mean
    log-probabilities.
    """
    settings, summary = report["settings"], report["summary"]
    if settings["min_count"] < sums.min_count:
        raise ValueError(f"the sums keep the types seen at least {sums.min_count} times; the report's min_count "
                         f"{settings['min_count']} needs every type seen that often.")
    options = {"alpha": settings["alpha"], "min_count": settings["min_count"], "top_k": settings["top_k"]}
    token_ids = np.sort(sums.table["token_id"].unique())
    capacity = int(token_ids.max()) + 1
    count = _per_type(sums, ["count"], token_ids)[0]  # [types]
    probe_sums = _per_type(sums, sums.columns(PROBE_SUMS), token_ids)  # [probes, types]
    probe_towers = np.asarray(summary["probe_towers"])
    num_towers = int(probe_towers.max()) + 1
    probe_means = np.zeros(probe_sums.shape[0])  # each probe's mean over all predictions, where centered
    if settings.get("center"):
        probe_means = sums.totals[sums.columns(PROBE_SUMS)].sum().to_numpy() / sums.totals["count"].sum()
    replica_weights = (np.arange(num_towers)[:, None] == probe_towers) / np.bincount(probe_towers)[:, None]
    tower_means = replica_weights @ probe_means  # [towers]
    centered_sums = probe_sums - probe_means[:, None] * count  # [probes, types]

    accumulator = ReplicaPreferenceAccumulator(probe_towers, summary["probe_runs"], vocab_size=capacity)
    accumulator.probe_sum_logprob[:, token_ids] = centered_sums
    occurrences = accumulator.occurrences
    occurrences.count[0, token_ids] = count
    occurrences.sum_logprob[0][:, token_ids] = replica_weights @ centered_sums
    has_squares = bool(sums.columns(PREFERENCE_SQUARES))
    if has_squares:  # the squares of each occurrence's preference less the global offset, as the sums are
        offset = tower_contrast(tower_means)[:, None]  # [towers, 1]
        sum_preference = tower_contrast(replica_weights @ probe_sums)  # [towers, types]
        squares = _tower_rows(_per_type(sums, sums.columns(PREFERENCE_SQUARES), token_ids), num_towers)
        occurrences.sum_sq_preference[0][:, token_ids] = squares - 2 * offset * sum_preference + offset**2 * count
    result = accumulator.compute(**options)
    result.summary = summary
    result.mean_logprob = result.mean_logprob + tower_means[:, None]
    result.probe_mean_logprob = result.probe_mean_logprob + probe_means[:, None]
    if not has_squares:
        result.occurrence_standard_error = result.occurrence_p_value = result.occurrence_significant = None
    return result, _ablation_result(sums, token_ids, count, num_towers, options)


def _ablation_result(sums: TypeSums, token_ids, count, num_towers: int, options: dict):
    """The ablation's PreferenceResult from its sums (None without them), as the scoring computes it (uncentered)."""
    if not sums.columns(ABLATION_SUMS):
        return None
    accumulator = PreferenceAccumulator(num_towers, int(token_ids.max()) + 1)
    accumulator.count[0, token_ids] = count
    accumulator.sum_logprob[0][:, token_ids] = _per_type(sums, sums.columns(ABLATION_SUMS), token_ids)
    has_squares = bool(sums.columns(ABLATION_SQUARES))
    if has_squares:
        squares = _per_type(sums, sums.columns(ABLATION_SQUARES), token_ids)
        accumulator.sum_sq_preference[0][:, token_ids] = _tower_rows(squares, num_towers)
    ablation = accumulator.compute(**options)
    if not has_squares:
        ablation.standard_error = ablation.p_value = ablation.significant = None
    return ablation


def _tower_rows(squares: np.ndarray, num_towers: int) -> np.ndarray:
    """[towers, types] the sums of squares of every tower (with two towers the table keeps tower 0's alone)."""
    return np.repeat(squares, num_towers, axis=0) if squares.shape[0] == 1 else squares


def per_token_table_from_sums(sums: TypeSums, report: dict, tokens_of) -> pd.DataFrame:
    """
    The per-token table (report.per_token_table) of the types the sums hold, recomputed from them; `tokens_of(ids)`
    gives the token strings of a list of ids (the run's tokenizer). The columns that need sums of squares the table
    lacks (OCCURRENCE_COLUMNS, ABLATION_TEST_COLUMNS) are left out.
    """
    result, ablation = preference_results(sums, report)
    left_out = []
    placeholder = np.zeros(result.token_ids.shape, bool)  # stands in for a column that is then dropped
    if result.occurrence_p_value is None:
        result.occurrence_p_value = result.occurrence_significant = placeholder
        left_out += OCCURRENCE_COLUMNS
    if ablation is not None and ablation.p_value is None:
        ablation.p_value = ablation.significant = placeholder
        left_out += ABLATION_TEST_COLUMNS
    table = per_token_table(result, tokens_of(result.token_ids.tolist()), {} if ablation is None else {"ablation": ablation})
    return table.drop(columns=left_out)
