"""Cross-fitting: documents numbered in text order, and the correlations of probe groups across document halves."""

import numpy as np
import pandas as pd
import pytest

from twotower.evaluation.scoring.cross_fitting import (
    WIKITEXT_ARTICLE_HEADING,
    CrossFittedPreference,
    number_documents,
    replica_groups,
)

NUM_TYPES, OCCURRENCES = 400, 24  # occurrences of every type in each document half
REPLICAS = 4  # per tower: groups of replicas 0-1 and 2-3


def test_documents_start_at_each_file_and_each_article_heading():
    lines = [" = Valkyrie = \n", "text\n", " = = Section = = \n", "more\n", " = Robert = \n", "last\n",
             "novel\n", "chapter\n"]  # fmt: skip
    # two files (6 and 2 lines); WikiText's article headings, not its section headings, start a document
    assert number_documents(lines, [6, 2], WIKITEXT_ARTICLE_HEADING).tolist() == [0, 0, 0, 0, 1, 1, 2, 2]
    assert number_documents(lines, [8], None).tolist() == [0] * 8  # one file, no pattern: one document
    assert number_documents(lines, [0, 8], None).tolist() == [0] * 8  # an empty file starts nothing


def test_replica_groups_split_each_towers_replicas_in_two():
    assert replica_groups(4) == [[0, 1], [2, 3]]
    assert replica_groups(3) == [[0], [1, 2]]


def planted_logprobs(seed, group_sd, text_sd):
    """
    Gold log-probabilities [probes, n] of 2 towers x REPLICAS probes, each type's preference made of a tower effect
    (sd 1, shared by everything), an effect of the probe group (what its training slice taught it: shared by the
    group's probes in both halves), an effect of the document half (what its articles are about: shared by every
    probe), and per-probe and per-occurrence noise. Predictions of half h are in documents 2k + h.
    """
    rng = np.random.default_rng(seed)
    tower_effect = rng.normal(0, 1, NUM_TYPES)
    group_effect = rng.normal(0, group_sd, (2, NUM_TYPES))
    text_effect = rng.normal(0, text_sd, (2, NUM_TYPES))
    token_ids = np.tile(np.repeat(np.arange(NUM_TYPES), OCCURRENCES), 2)
    half = np.repeat([0, 1], NUM_TYPES * OCCURRENCES)
    documents = 2 * rng.integers(0, 10, half.shape) + half
    rows = []
    for tower in (0, 1):
        sign = 0.5 if tower == 0 else -0.5
        for replica in range(REPLICAS):
            group = replica // 2
            preference = tower_effect + group_effect[group] + rng.normal(0, 0.1, NUM_TYPES)
            per_prediction = sign * (preference[token_ids] + text_effect[half, token_ids])
            rows.append(-3.0 + per_prediction + rng.normal(0, 0.3, token_ids.shape))
    return token_ids, np.minimum(np.stack(rows), 0.0), documents


def independent_correlations(token_ids, gold, documents, min_count):
    """The three correlations with pandas: per (half, type) mean of each group's tower-0-minus-tower-1 difference."""
    frame = pd.DataFrame({"type": token_ids, "half": documents % 2})
    for name, replicas in (("a", [0, 1]), ("b", [2, 3])):
        frame[name] = gold[replicas].mean(axis=0) - gold[[REPLICAS + r for r in replicas]].mean(axis=0)
    means = frame.groupby(["half", "type"])[["a", "b"]].mean()
    counts = frame.groupby(["half", "type"]).size().unstack("half")
    eligible = counts.index[(counts >= min_count).all(axis=1)]
    a1, a2 = (means.loc[half, "a"].reindex(eligible) for half in (0, 1))
    b1, b2 = (means.loc[half, "b"].reindex(eligible) for half in (0, 1))
    return {
        "cross_fitted_r": np.mean([a1.corr(b2), b1.corr(a2)]),
        "same_probes_other_text_r": np.mean([a1.corr(a2), b1.corr(b2)]),
        "other_probes_same_text_r": np.mean([a1.corr(b1), a2.corr(b2)]),
        "num_types": len(eligible),
    }


@pytest.mark.parametrize("group_sd, text_sd", [(0.7, 0.5), (0.0, 0.0), (1.0, 0.0)])
def test_the_three_correlations_recover_the_planted_shares(group_sd, text_sd):
    token_ids, gold, documents = planted_logprobs(0, group_sd, text_sd)
    cross_fit = CrossFittedPreference(num_towers=2, replicas_per_tower=REPLICAS, vocab_size=NUM_TYPES)
    for chunk in np.array_split(np.arange(token_ids.shape[0]), 7):  # in batches, as the engine feeds it
        cross_fit.update(token_ids[chunk], gold[:, chunk], documents[chunk])
    result = cross_fit.compute(min_count=10)

    expected = independent_correlations(token_ids, gold, documents, min_count=10)
    for key, value in expected.items():
        assert result[key] == pytest.approx(value, rel=1e-9), key
    assert result["num_documents"] == [10, 10]
    # the planted variance shares (occurrence and probe noise add a little to every denominator)
    total = 1 + group_sd**2 + text_sd**2
    assert result["cross_fitted_r"] == pytest.approx(1 / total, abs=0.07)
    assert result["same_probes_other_text_r"] == pytest.approx((1 + group_sd**2) / total, abs=0.07)
    assert result["other_probes_same_text_r"] == pytest.approx((1 + text_sd**2) / total, abs=0.07)


def test_a_text_of_one_document_gives_no_correlation():
    token_ids, gold, documents = planted_logprobs(1, 0.5, 0.5)
    cross_fit = CrossFittedPreference(num_towers=2, replicas_per_tower=REPLICAS, vocab_size=NUM_TYPES)
    cross_fit.update(token_ids, gold, np.zeros_like(documents))  # every prediction in half 0
    result = cross_fit.compute(min_count=10)
    assert result["num_types"] == 0 and result["cross_fitted_r"] is None and result["num_documents"] == [1, 0]


def test_one_replica_per_tower_cannot_be_cross_fitted():
    with pytest.raises(ValueError, match="at least 2 probe replicas per tower; got 1"):
        CrossFittedPreference(num_towers=2, replicas_per_tower=1, vocab_size=10)
