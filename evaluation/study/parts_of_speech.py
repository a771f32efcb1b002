"""
Endpoint 3 of the study's 2x2 (docs/study.md, "What causes the split"): the function-word against content-word
contrast of one run, recomputed from what the study keeps, and its sign across seeds.

A run keeps `type_sums.parquet` (evaluation/cross_fitting.py, CrossFittedPreference.type_sums: columns half,
token_id, count and logprob_sum_probe{k}, probe k = tower * replicas_per_tower + replica). From it, each type's
cross-fitted preference: replica group A's and group B's per-type preference on each half of the scored documents,
as the cross-fitted correlation compares them, averaged over the two groups and two halves, over the types seen at
least `min_count` times in each half. It is given in the report's units (a tower's mean log-probability minus the
mean of the other towers', nats: with two towers tower 0 minus tower 1), less its mean over the types, which no
difference of means reads. The types' tags come from tagging the scored text with the run's tokenizer
(`tag_text(text, tokenizer).type_tags()`, once per text and tokenizer).

    contrast = cross_fitted_function_content_contrast("run/type_sums.parquet", type_tags, replicas_per_tower=4)
    contrast["d_nats"], contrast["z"], contrast["p_value"]
    across = seeds_function_content_contrast([{"type_sums": ..., "type_tags": ...} for each seed])
    across["runs"][seed]["d_nats"], across["sign_consistency"]

The study tags each scored text once for its runs' tokenizer and keeps the tags beside the runs
(`REPORT_DIR/type_tags/TEXT-TOKENIZER.parquet`, `kept_type_tag_table`), so that the contrast is recomputed from kept files
alone, without spaCy.
"""

import gzip
from pathlib import Path

import numpy as np
import pandas as pd
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from twotower.training.data.blocks import load_raw_datasets
from twotower.training.utils.atomic import write_atomically

from ..scoring.cross_fitting import CrossFittedPreference
from ..scoring.parts_of_speech_tagging import AGREEMENT_THRESHOLD, TypeTags, tag_lines, tagged_types, tagger_available
from .kept_files import set_aside_damaged_table
from .kept_tables import tokenizer_digest
from ..tower_preference.parts_of_speech import (
    CONTENT_TAGS, FUNCTION_TAGS, NUM_PERMUTATIONS, contrast_across_runs, function_content_contrast,
)


def read_type_sums(type_sums) -> pd.DataFrame:
    """A type_sums table: a DataFrame as it is, or a run's type_sums.parquet (a path) read."""
    if isinstance(type_sums, pd.DataFrame):
        return type_sums
    path = Path(type_sums)
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not a file; pass a run's type_sums.parquet or its table.")
    return pd.read_parquet(path)


def cross_fitted_tower_preference(type_sums, num_towers: int = 2, replicas_per_tower: int = 4, min_count: int = 10):
    """
    (token ids [types], preference [towers, types] in nats) of the types seen at least `min_count` times in each
    half: the cross-fitted groups' per-type preferences averaged (module docstring).

    Args:
        type_sums: a run's type_sums table or the path of its type_sums.parquet.
        num_towers, replicas_per_tower: the run's (probe k = tower * replicas_per_tower + replica).
    """
    table = read_type_sums(type_sums)
    probes = sum(column.startswith("logprob_sum_probe") for column in table.columns)
    if probes != num_towers * replicas_per_tower:
        raise ValueError(
            f"the table has {probes} probe columns, not num_towers x replicas_per_tower = "
            f"{num_towers} x {replicas_per_tower}; pass the run's numbers."
        )
    cross_fit = CrossFittedPreference.from_type_sums(table, num_towers, replicas_per_tower)
    token_ids, centered = cross_fit.mean_preference(min_count)
    return token_ids, centered * num_towers / (num_towers - 1)  # from deviations from the towers' mean


def cross_fitted_function_content_contrast(
    type_sums, type_tags: dict, num_towers: int = 2, replicas_per_tower: int = 4, min_count: int = 10,
    permutations: int = NUM_PERMUTATIONS, seed: int = 0, remove_frequency_trend: bool = False,
) -> dict:
    """
    One run's contrast d of tower 0 (function-word types minus content-word types, each type weighted equally), z
    against the permutation null of the labels, and p (tower_preference.parts_of_speech.function_content_contrast),
    with "num_eligible_types" (in both halves) and "num_tagged_types" (of them, those with a tag in type_tags); d, z
    and p are None where the eligible types lack function words or content words (a text too short).

    Args:
        type_sums: the run's type_sums table or the path of its type_sums.parquet.
        type_tags: {token id: UPOS tag} of the types tagged on the scored text (TypeTags.type_tags()).
        remove_frequency_trend: first remove from the preference its least-squares line on each type's log count
            (both halves), since function words are the most frequent types: what is left is not frequency.
    """
    table = read_type_sums(type_sums)
    token_ids, preference = cross_fitted_tower_preference(table, num_towers, replicas_per_tower, min_count)
    tags = _tags_of(token_ids, type_tags)
    counts = {"num_eligible_types": int(token_ids.size), "num_tagged_types": int((tags != "").sum())}
    if not has_both_groups(tags):
        return {"d_nats": None, "z": None, "p_value": None} | counts
    tower_0 = preference[0]
    if remove_frequency_trend:
        log_count = np.log(table.groupby("token_id")["count"].sum().reindex(token_ids).to_numpy(np.float64))
        design = np.column_stack([np.ones_like(log_count), log_count])
        tower_0 = tower_0 - design @ np.linalg.lstsq(design, tower_0, rcond=None)[0]
    contrast = function_content_contrast(tower_0, tags, permutations, seed)
    return contrast | counts | {"variance_share": label_variance_share(tower_0, tags)}


def label_variance_share(preference: np.ndarray, tags: np.ndarray) -> float:
    """The share of the per-type preference's variance, over the function-word and content-word types, that the
    function/content label explains (R^2 of the preference on the label: between-group over total sum of squares)."""
    is_function = np.isin(tags, FUNCTION_TAGS)
    labelled = is_function | np.isin(tags, CONTENT_TAGS)
    values, labels = preference[labelled], is_function[labelled]
    total = ((values - values.mean()) ** 2).sum()
    between = sum(group.size * (group.mean() - values.mean()) ** 2 for group in (values[labels], values[~labels]))
    return float(between / total) if total > 0 else 0.0


def has_both_groups(tags) -> bool:
    """Whether the tags hold a function-word and a content-word type: what the contrast compares."""
    return bool(np.isin(tags, FUNCTION_TAGS).any() and np.isin(tags, CONTENT_TAGS).any())


def seeds_function_content_contrast(runs, min_count: int = 10, permutations: int = NUM_PERMUTATIONS, seed: int = 0):
    """
    The contrast of each seed's run after orienting its towers to the first run's (matched correlation of the
    cross-fitted preference over the types both runs have), and the sign consistency of d.

    Args:
        runs: per seed, {"type_sums": table or path, "type_tags": {token id: UPOS}} and, where they are not 2 and 4,
            "num_towers" and "replicas_per_tower". The first run is the reference.

    Returns:
        tower_preference.parts_of_speech.contrast_across_runs: {"runs": [contrast with "tower_mapping" and
        "matched_correlation"], "sign_consistency"}.
    """
    oriented = []
    for run in runs:
        token_ids, preference = cross_fitted_tower_preference(
            run["type_sums"], run.get("num_towers", 2), run.get("replicas_per_tower", 4), min_count
        )
        oriented.append(
            {"token_ids": token_ids, "preference_nats": preference, "tags": _tags_of(token_ids, run["type_tags"])}
        )
    return contrast_across_runs(oriented, permutations, seed)


def tag_text(text_path, tokenizer, text_column_name: str = "text") -> TypeTags:
    """The tags of a scored text (a file or a folder of them, read line by line as the scoring command reads it) for
    a run's tokenizer: tag it once per text and tokenizer, and pass `.type_tags()` to every run that shares them (the
    table, `.table()`, saves as Parquet; its rows with `tagged` give the same dict)."""
    lines = load_raw_datasets(None, train_file=str(text_path))["train"][text_column_name]
    return tag_lines(lines, tokenizer)


TYPE_TAGS_DIR = "type_tags"


def type_tags_path(report_dir, text_name: str, tokenizer_file) -> Path:
    """Where the study keeps a text's tags for a kept run's tokenizer (its gzipped tokenizer.json,
    kept_tables.kept_tokenizer_file): `report_dir/type_tags/{text_name}-{kept_tables.tokenizer_digest}.parquet`, the
    digest that also names the tokenizer's kept file."""
    digest = tokenizer_digest(gzip.decompress(Path(tokenizer_file).read_bytes()))
    return Path(report_dir, TYPE_TAGS_DIR, f"{text_name}-{digest}.parquet")


def kept_type_tag_table(report_dir, text_name: str, text_path, tokenizer_file) -> pd.DataFrame | None:
    """
    The tags of a scored text for a kept run's tokenizer (TypeTags.table(): token_id, count, tag, agreement,
    tagged): read from its `type_tags_path` where the study kept it, else tagged now (`tag_text`) and kept there;
    None when it is not kept and the `pos` extra is not installed. `tags_at` gives {token id: UPOS} at a threshold.
    """
    path = type_tags_path(report_dir, text_name, tokenizer_file)
    set_aside_damaged_table(path, "type_tags", "the text is tagged again (where spaCy is installed).")
    if not path.is_file():
        if not tagger_available():
            return None
        tokenizer_json = gzip.decompress(Path(tokenizer_file).read_bytes()).decode()
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(tokenizer_json))
        table = tag_text(text_path, tokenizer).table()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, lambda tmp: table.to_parquet(tmp, index=False))
    return pd.read_parquet(path)


def tags_at(table: pd.DataFrame, threshold: float = AGREEMENT_THRESHOLD) -> dict[int, str]:
    """{token id: UPOS} of a kept tags table: the types whose majority tag has at least `threshold` of their
    occurrences (at the tagging's own threshold, the rows marked `tagged`)."""
    if threshold == AGREEMENT_THRESHOLD:
        return tagged_types(table)
    tagged = table[table["agreement"] >= threshold]
    return dict(zip(tagged["token_id"].tolist(), tagged["tag"].tolist()))


def noise_only_table(type_sums: pd.DataFrame, tower: int, replicas_per_tower: int) -> pd.DataFrame:
    """
    A two-"tower" type_sums table of one tower's probe noise alone: pseudo-tower 0 holds replicas 0, 2, ... of
    `tower` and pseudo-tower 1 replicas 1, 3, ..., so that each cross-fitting group of the pseudo-run holds replicas of
    the real run's same group (the first and the second half of the tower's replicas). Its preference is what the
    probes' noise gives where the towers cannot differ.
    """
    if replicas_per_tower < 4 or replicas_per_tower % 4:
        raise ValueError(f"a noise-only pseudo-run splits each group of replicas in two: needs a multiple of 4 "
                         f"replicas per tower, got {replicas_per_tower}.")
    first = tower * replicas_per_tower
    order = [*range(0, replicas_per_tower, 2), *range(1, replicas_per_tower, 2)]
    columns = {f"logprob_sum_probe{new}": type_sums[f"logprob_sum_probe{first + old}"] for new, old in enumerate(order)}
    return pd.DataFrame({"half": type_sums["half"], "token_id": type_sums["token_id"], "count": type_sums["count"],
                         **columns})


def noise_only_contrast_z(type_sums, type_tags: dict, num_towers: int = 2, replicas_per_tower: int = 4,
                          min_count: int = 10) -> float | None:
    """The part-of-speech z of a run's probe noise alone: the mean over towers of each noise-only pseudo-run's z
    (`noise_only_table`), None where one has no contrast. The bar a run's own z has to clear."""
    table = read_type_sums(type_sums)
    values = [cross_fitted_function_content_contrast(noise_only_table(table, tower, replicas_per_tower), type_tags, 2,
                                                     replicas_per_tower // 2, min_count)["z"]
              for tower in range(num_towers)]
    return None if any(value is None for value in values) else float(np.mean(values))


def _tags_of(token_ids, type_tags: dict) -> np.ndarray:
    """[types] each type's tag, "" for a type without one (left out of the contrast)."""
    return np.array([type_tags.get(int(token_id), "") for token_id in token_ids], dtype=object).astype(str)
