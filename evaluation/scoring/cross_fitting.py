"""
Cross-fitted tower preference: do probes that share neither training text nor scored text find the same per-type
preference?

Two probes of one tower trained on the same blocks and scored on the same text agree partly because of what that
text taught them, and the per-type preference of a scored text partly reflects its topics. So the scored text is
split by document (an article, a book) into two halves, alternate documents in each, and the probe replicas into
two groups, the first and the second half of each tower's replicas (trained on disjoint slices of the training
text with `--probe_replica_data disjoint`). The cross-fitted correlation compares group A's preference on half 1
with group B's on half 2 (and B on 1 with A on 2): neither probes nor text in common. Beside it, the two
correlations that change one of the two, which tell how much each shared part adds.

A type's preference here is each tower's mean log-probability of it over its occurrences in a half, averaged over
the group's replicas, centered over the eligible types and over the towers (with two towers, half the usual
difference of tower 0 minus tower 1, less its mean over types); correlations are Pearson's over the eligible types
(seen at least `min_count` times in each half) and towers.
"""

import re

import numpy as np
import pandas as pd

from ..tower_preference.measure_agreement import pooled_pearson
from ..tower_preference.preference_stats import tower_contrast

NUM_HALVES = 2
# WikiText's article headings (" = Title = "; sections have "= =")
WIKITEXT_ARTICLE_HEADING = r"^ = [^=].* = $"


def number_documents(lines: list[str], file_line_counts: list[int], heading_pattern: str | None) -> np.ndarray:
    """
    The document of every line, numbered in text order from 0: a new one at the start of each file and at every
    line (its line break removed) that matches `heading_pattern`.
    """
    starts = np.zeros(len(lines), bool)
    starts[np.cumsum([0, *file_line_counts[:-1]])[np.array(file_line_counts) > 0]] = True
    if heading_pattern is not None:
        heading = re.compile(heading_pattern)
        starts |= np.fromiter((bool(heading.match(line.rstrip("\r\n"))) for line in lines), bool, len(lines))
    starts[:1] = False  # the first document is 0, whatever starts it
    return np.cumsum(starts)


def replica_groups(replicas_per_tower: int) -> list[list[int]]:
    """The two replica groups: the first half of a tower's replicas, and the rest."""
    split = replicas_per_tower // 2
    return [list(range(split)), list(range(split, replicas_per_tower))]


class CrossFittedPreference:
    """
    Per-type sums of every probe's gold log-probabilities (and, where fed, of each tower's mean-ablation increase), per
    half of the scored documents: what the cross-fitted correlations read, and the table (`type_sums`) from which
    every per-type figure of a report can be recomputed. Beside the sums, the sums of squares that the occurrence-level
    tests need (scoring/type_sums.py): of each tower's preference per occurrence (its replica-mean log-prob less the
    other towers', the per-occurrence difference that PreferenceAccumulator tests) and of each tower's ablation
    increase less the other towers'.

    Args:
        num_towers: towers of the model.
        replicas_per_tower: probes per tower (>= 2), tower-major in gold_logprobs (probe t * replicas + r).
        vocab_size: token ids are below it.

    Example:
        >>> cross_fit = CrossFittedPreference(num_towers=2, replicas_per_tower=2, vocab_size=8)
        >>> gold = np.log([[.5, .1, .3, .4, .2, .3], [.6, .1, .3, .5, .1, .3],   # tower 0, replicas 0 and 1
        ...                [.1, .5, .3, .2, .4, .3], [.1, .6, .2, .1, .5, .3]])  # tower 1
        >>> cross_fit.update([1, 2, 3, 1, 2, 3], gold, documents=[0, 0, 0, 1, 1, 1])  # documents 0 and 1: halves
        >>> round(cross_fit.compute(min_count=1)["cross_fitted_r"], 3)
        0.996
    """

    def __init__(self, num_towers: int, replicas_per_tower: int, vocab_size: int):
        if replicas_per_tower < 2:
            raise ValueError(f"cross-fitting needs at least 2 probe replicas per tower; got {replicas_per_tower}.")
        self.num_towers, self.replicas_per_tower = num_towers, replicas_per_tower
        self.sum_logprob = np.zeros((NUM_HALVES, num_towers * replicas_per_tower, vocab_size))  # float64
        self.count = np.zeros((NUM_HALVES, vocab_size), np.int64)
        self.preference_sq_sum = np.zeros((NUM_HALVES, num_towers, vocab_size))  # float64; None: a table without it
        self.ablation_increase_sum = None  # [halves, towers, vocab] float64, once `update_ablation` is fed
        self.ablation_preference_sq_sum = None  # [halves, towers, vocab] float64, likewise
        self.documents = [set(), set()]  # the documents seen in each half
        self._batch_documents = None  # the current batch's "document" [batch], as score_blocks feeds it

    def begin_batch(self, batch) -> None:
        self._batch_documents = batch["document"]

    def update_pass(self, scored_pass) -> None:
        """One scoring pass (scoring/engine.py): the first probe set's gold log-probabilities and, where computed,
        the ablation increases, each prediction in the half of its block's document."""
        rows = scored_pass.scored.nonzero(as_tuple=True)[0].cpu()  # the block of every scored position, in order
        documents = self._batch_documents[rows].numpy()
        self.update(scored_pass.token_ids, scored_pass.probe_gold[0], documents)
        if scored_pass.ablation_increases is not None:
            self.update_ablation(scored_pass.token_ids, scored_pass.ablation_increases, documents)

    def update(self, token_ids, gold_logprobs, documents) -> None:
        """token_ids [n], gold_logprobs [probes, n], documents [n]: the document of each prediction (its half: the
        parity of its number, documents counted in text order)."""
        token_ids, documents = np.asarray(token_ids), np.asarray(documents)
        gold_logprobs = np.asarray(gold_logprobs, np.float64)
        vocab_size = self.count.shape[1]
        replica_means = gold_logprobs.reshape(self.num_towers, self.replicas_per_tower, -1).mean(axis=1)
        sq_preference = tower_contrast(replica_means) ** 2  # [towers, n]
        for half in range(NUM_HALVES):
            in_half = documents % NUM_HALVES == half
            ids = token_ids[in_half]
            self.count[half] += np.bincount(ids, minlength=vocab_size)
            for probe, logprobs in enumerate(gold_logprobs[:, in_half]):
                self.sum_logprob[half, probe] += np.bincount(ids, weights=logprobs, minlength=vocab_size)
            for tower, squares in enumerate(sq_preference[:, in_half]):
                self.preference_sq_sum[half, tower] += np.bincount(ids, weights=squares, minlength=vocab_size)
            self.documents[half].update(np.unique(documents[in_half]).tolist())

    def update_ablation(self, token_ids, increases, documents) -> None:
        """token_ids [n], increases [towers, n] (scoring/ablation.py: the joint model's loss increase with each tower
        mean-ablated), documents [n], as in `update`."""
        token_ids, documents = np.asarray(token_ids), np.asarray(documents)
        increases = np.asarray(increases, np.float64)
        if self.ablation_increase_sum is None:
            self.ablation_increase_sum = np.zeros((NUM_HALVES, self.num_towers, self.count.shape[1]))
            self.ablation_preference_sq_sum = np.zeros_like(self.ablation_increase_sum)
        sq_preference = tower_contrast(increases) ** 2  # [towers, n]
        for half in range(NUM_HALVES):
            in_half = documents % NUM_HALVES == half
            for tower in range(self.num_towers):
                self.ablation_increase_sum[half, tower] += np.bincount(
                    token_ids[in_half], weights=increases[tower, in_half], minlength=self.count.shape[1]
                )
                self.ablation_preference_sq_sum[half, tower] += np.bincount(
                    token_ids[in_half], weights=sq_preference[tower, in_half], minlength=self.count.shape[1]
                )

    def type_sums(self) -> pd.DataFrame:
        """
        One row per half and token type seen in it: `half`, `token_id`, `count`, `logprob_sum_probe{k}` (probe k
        tower-major: replica r of tower t is k = t * replicas + r), `preference_sq_sum_tower{t}` and, where fed,
        `ablation_increase_sum_tower{t}` and `ablation_preference_sq_sum_tower{t}` (sums of squares: one column per
        tower, tower 0's alone with two towers, whose preferences are one another's negatives). Sums, not means, so
        that halves add up and any grouping of probes, halves or types can be recomputed.
        """
        contrasts = range(1 if self.num_towers == 2 else self.num_towers)
        frames = []
        for half in range(NUM_HALVES):
            seen = np.flatnonzero(self.count[half])
            columns = {"half": np.full(seen.size, half, np.int8), "token_id": seen, "count": self.count[half, seen]}
            for probe, sums in enumerate(self.sum_logprob[half]):
                columns[f"logprob_sum_probe{probe}"] = sums[seen]
            if self.preference_sq_sum is not None:
                for tower in contrasts:
                    columns[f"preference_sq_sum_tower{tower}"] = self.preference_sq_sum[half, tower, seen]
            if self.ablation_increase_sum is not None:
                for tower, sums in enumerate(self.ablation_increase_sum[half]):
                    columns[f"ablation_increase_sum_tower{tower}"] = sums[seen]
            if self.ablation_preference_sq_sum is not None:
                for tower in contrasts:
                    squares = self.ablation_preference_sq_sum[half, tower, seen]
                    columns[f"ablation_preference_sq_sum_tower{tower}"] = squares
            frames.append(pd.DataFrame(columns))
        return pd.concat(frames, ignore_index=True)

    @classmethod
    def from_type_sums(cls, table: pd.DataFrame, num_towers: int, replicas_per_tower: int) -> "CrossFittedPreference":
        """The sums of a `type_sums` table (as a run keeps it in type_sums.parquet), ready for `compute`; the sums of
        squares too where the table has them (a run kept before them has none)."""
        cross_fit = cls(num_towers, replicas_per_tower, int(table["token_id"].max()) + 1)
        half, token_id = table["half"].to_numpy(), table["token_id"].to_numpy()
        cross_fit.count[half, token_id] = table["count"].to_numpy()
        for probe in range(num_towers * replicas_per_tower):
            cross_fit.sum_logprob[half, probe, token_id] = table[f"logprob_sum_probe{probe}"].to_numpy()
        cross_fit.preference_sq_sum = _tower_sums(table, "preference_sq_sum_tower", num_towers, cross_fit.count.shape)
        cross_fit.ablation_increase_sum = _tower_sums(table, "ablation_increase_sum_tower", num_towers,
                                                      cross_fit.count.shape)
        cross_fit.ablation_preference_sq_sum = _tower_sums(table, "ablation_preference_sq_sum_tower", num_towers,
                                                           cross_fit.count.shape)
        return cross_fit

    def mean_preference(self, min_count: int = 10) -> tuple[np.ndarray, np.ndarray]:
        """(token ids [types], preference [towers, types]) of the types seen at least `min_count` times in each half:
        the mean of the four group-and-half preferences that the correlations compare (centered as they are)."""
        eligible = (self.count >= min_count).all(axis=0)
        preferences = [self._preference(half, group, eligible)
                       for group in replica_groups(self.replicas_per_tower) for half in range(NUM_HALVES)]
        return np.flatnonzero(eligible), np.mean(preferences, axis=0).T

    def _preference(self, half: int, replicas: list[int], eligible: np.ndarray) -> np.ndarray:
        """[types, towers]: each tower's mean log-prob over the group's replicas, centered over types and towers."""
        sums = self.sum_logprob[half].reshape(self.num_towers, self.replicas_per_tower, -1)[:, replicas]
        means = sums[:, :, eligible].mean(axis=1).T / self.count[half, eligible][:, None]  # [types, towers]
        means = means - means.mean(axis=0)
        return means - means.mean(axis=1, keepdims=True)

    def compute(self, min_count: int = 10) -> dict:
        """The three correlations (None when fewer than 3 types are eligible or a half is empty), and the counts."""
        eligible = (self.count >= min_count).all(axis=0)
        summary = {
            "replica_groups": replica_groups(self.replicas_per_tower),
            "num_documents": [len(documents) for documents in self.documents],
            "num_predictions": self.count.sum(axis=1).tolist(),
            "min_count": min_count,
            "num_types": int(eligible.sum()),
            "cross_fitted_r": None,
            "same_probes_other_text_r": None,
            "other_probes_same_text_r": None,
        }
        if eligible.sum() < 3:
            return summary
        group_a, group_b = summary["replica_groups"]
        a1, a2, b1, b2 = (self._preference(half, group, eligible)
                          for group in (group_a, group_b) for half in range(NUM_HALVES))
        summary["cross_fitted_r"] = _mean([pooled_pearson(a1, b2), pooled_pearson(b1, a2)])
        summary["same_probes_other_text_r"] = _mean([pooled_pearson(a1, a2), pooled_pearson(b1, b2)])
        summary["other_probes_same_text_r"] = _mean([pooled_pearson(a1, b1), pooled_pearson(a2, b2)])
        return summary


def _tower_sums(table: pd.DataFrame, prefix: str, num_towers: int, shape: tuple) -> np.ndarray | None:
    """[halves, towers, vocab] the table's per-tower columns `prefix`{t} at (half, token_id); with two towers and
    tower 0's column alone (a sum of squares), tower 1's is the same; None where the table has no such column."""
    if f"{prefix}0" not in table:
        return None
    half, token_id = table["half"].to_numpy(), table["token_id"].to_numpy()
    sums = np.zeros((shape[0], num_towers, shape[1]))
    for tower in range(num_towers):
        column = f"{prefix}{tower}" if num_towers != 2 or f"{prefix}{tower}" in table else f"{prefix}0"
        sums[half, tower, token_id] = table[column].to_numpy()
    return sums


def _mean(values: list) -> float | None:
    return None if any(value is None for value in values) else float(np.mean(values))
