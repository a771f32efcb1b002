# Copyright 2026 The twotower Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Tower preference by part of speech: is the split function words against content words (syntax against semantics)?

Input: one tower's per-type preference (nats) and each type's coarse part of speech (a Universal Dependencies UPOS
tag, e.g. from twotower.evaluation.scoring.parts_of_speech_tagging: the majority tag of the type's occurrences in the scored
text). Output:

- per tag: the mean preference over its types (types weighted equally), a 95% percentile bootstrap interval over
  the types, and the number of types;
- the function/content contrast d: the mean preference over function-word types (FUNCTION_TAGS) minus that over
  content-word types (CONTENT_TAGS). Its size is standardized against permutations of the two labels over the same
  types: z = (|d| - mean of the null |d|) / sd of the null |d|, with the permutation p-value of |d|;
- across runs (seeds): each run's towers oriented to a reference run's by the matched correlation of their per-type
  preferences (comparisons.py), since tower labels are arbitrary, then the sign consistency of d.

Numpy only (no tagger): the `evaluate` module beside it and the twotower package share it.
"""

import math

import numpy as np

from .comparisons import compare_preferences


FUNCTION_TAGS = ("DET", "ADP", "PRON", "AUX", "CCONJ", "SCONJ", "PART")  # closed classes: the syntax reading
CONTENT_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "PROPN")  # open classes: the semantics reading
NUM_PERMUTATIONS = 1000
NUM_BOOTSTRAPS = 1000
CONFIDENCE = 0.95


def tag_group(tag: str) -> str:
    """The group of a UPOS tag: "function", "content" or "other" (NUM, PUNCT, SYM, X, INTJ, ...)."""
    return "function" if tag in FUNCTION_TAGS else "content" if tag in CONTENT_TAGS else "other"


def tag_preferences(preference, tags, bootstraps=NUM_BOOTSTRAPS, seed=0) -> list[dict]:
    """
    Per tag: {"tag", "group", "num_types", "mean_preference_nats", "ci"} with ci the 95% percentile bootstrap
    interval of the mean over the tag's types ([None, None] for a single type); function tags first, then content,
    then the others, each in FUNCTION_TAGS / CONTENT_TAGS order (the others alphabetical).

    Args:
        preference: [types] one tower's preference (nats).
        tags: [types] each type's UPOS tag.

    Example:
        >>> rows = tag_preferences([1.0, 1.2, -0.5, -0.7, 0.1], ["DET", "DET", "NOUN", "NOUN", "NUM"])
        >>> [(row["tag"], row["num_types"], round(row["mean_preference_nats"], 2)) for row in rows]
        [('DET', 2, 1.1), ('NOUN', 2, -0.6), ('NUM', 1, 0.1)]
    """
    preference, tags = _checked(preference, tags)
    rng = np.random.default_rng(seed)
    order = {tag: index for index, tag in enumerate(FUNCTION_TAGS + CONTENT_TAGS)}
    rows = []
    for tag in sorted(set(tags.tolist()), key=lambda tag: (order.get(tag, len(order)), tag)):
        values = preference[tags == tag]
        ci = [None, None]
        if values.size > 1:
            means = values[rng.integers(0, values.size, (bootstraps, values.size))].mean(axis=1)
            tail = (1 - CONFIDENCE) / 2
            ci = [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]
        rows.append({
            "tag": tag, "group": tag_group(tag), "num_types": int(values.size),
            "mean_preference_nats": float(values.mean()), "ci": ci,
        })
    return rows


def function_content_contrast(preference, tags, permutations=NUM_PERMUTATIONS, seed=0) -> dict:
    """
    d = mean preference over function-word types minus over content-word types (types of other tags left out), its
    permutation null (the function/content labels shuffled over the same types), z = (|d| - null mean) / null sd of
    |d| (None when the null does not vary), and the two-sided permutation p-value, (1 + #{null |d| >= |d|}) /
    (1 + permutations).

    Returns:
        {"d_nats", "null_mean_nats", "null_sd_nats", "z", "p_value", "num_function_types", "num_content_types",
        "permutations"}.

    Example: tower 0 better on determiners and prepositions than on nouns and verbs
        >>> rng = np.random.default_rng(0)
        >>> tags = np.repeat(["DET", "ADP", "NOUN", "VERB"], 50)
        >>> preference = rng.normal(0.0, 0.2, 200) + np.where(np.isin(tags, ["DET", "ADP"]), 0.3, 0.0)
        >>> contrast = function_content_contrast(preference, tags)
        >>> round(contrast["d_nats"], 2), contrast["z"] > 5, round(contrast["p_value"], 4)
        (0.33, True, 0.001)
    """
    preference, tags = _checked(preference, tags)
    is_function, is_content = np.isin(tags, FUNCTION_TAGS), np.isin(tags, CONTENT_TAGS)
    num_function, num_content = int(is_function.sum()), int(is_content.sum())
    if num_function == 0 or num_content == 0:
        raise ValueError(
            f"the contrast needs function-word and content-word types; got {num_function} function ({FUNCTION_TAGS}) "
            f"and {num_content} content ({CONTENT_TAGS})."
        )
    values = preference[is_function | is_content]
    labels = is_function[is_function | is_content]
    d = _difference(values, labels)
    rng = np.random.default_rng(seed)
    null = np.abs([_difference(values, rng.permutation(labels)) for _ in range(permutations)])
    null_sd = float(null.std(ddof=1)) if permutations > 1 else 0.0
    return {
        "d_nats": d,
        "null_mean_nats": float(null.mean()),
        "null_sd_nats": null_sd,
        "z": (abs(d) - float(null.mean())) / null_sd if null_sd > 0 else None,
        # a permutation that reproduces the labels gives |d| again, up to rounding: it counts as at least as large
        "p_value": float((1 + np.sum(null >= abs(d) - 1e-12)) / (1 + permutations)),
        "num_function_types": num_function,
        "num_content_types": num_content,
        "permutations": permutations,
    }


def parts_of_speech_summary(token_ids, preference_nats, type_tags: dict, bootstraps=NUM_BOOTSTRAPS,
                            permutations=NUM_PERMUTATIONS, seed=0) -> dict:
    """
    The per-tag preference and the function/content contrast of each shown tower (tower 0 alone with two towers,
    whose tower 1 mirrors it) over the given types that have a tag.

    Args:
        token_ids: [types] the types to read (e.g. the eligible ones).
        preference_nats: [towers, types] their preference.
        type_tags: {token id: UPOS tag}; types without one are left out.

    Returns:
        {"num_tagged_types", "towers": [{"tower", "per_tag", "function_content"}]}, function_content None where
        one of the two groups has no type.
    """
    token_ids = np.asarray(token_ids)
    preference_nats = np.asarray(preference_nats, np.float64)
    tagged = np.array([int(token_id) in type_tags for token_id in token_ids], bool)
    tags = np.array([type_tags[int(token_id)] for token_id in token_ids[tagged]], dtype=object).astype(str)
    towers = []
    for tower in range(1 if preference_nats.shape[0] == 2 else preference_nats.shape[0]):
        values = preference_nats[tower, tagged]
        try:
            contrast = function_content_contrast(values, tags, permutations, seed)
        except ValueError:
            contrast = None
        towers.append({
            "tower": tower, "per_tag": tag_preferences(values, tags, bootstraps, seed), "function_content": contrast,
        })
    return {"num_tagged_types": int(tagged.sum()), "towers": towers}


def orient_towers(token_ids, preference_nats, reference_token_ids, reference_preference_nats):
    """
    A run's preference with its towers reordered to match a reference run's ([towers, types], row i matched to the
    reference's tower i by the matched correlation over their shared types), the matching, and its correlation.

    Example: the same split with the tower labels swapped
        >>> oriented, mapping, correlation = orient_towers(
        ...     [1, 2, 3], [[-1.0, 2.0, -1.0], [1.0, -2.0, 1.0]], [1, 2, 3], [[1.0, -2.0, 0.9], [-1.0, 2.0, -0.9]])
        >>> oriented[0].tolist(), mapping, round(correlation, 3)
        ([1.0, -2.0, 1.0], [1, 0], 1.0)
    """
    comparison = compare_preferences(reference_token_ids, reference_preference_nats, token_ids, preference_nats)
    mapping = comparison["tower_mapping"]
    return np.asarray(preference_nats, np.float64)[mapping], mapping, comparison["correlation"]


def sign_consistency(contrasts) -> dict:
    """
    How consistent the sign of d is across runs (after orienting their towers): {"num_runs", "num_positive",
    "num_negative", "share_same_sign" (the larger sign's share of the nonzero d), "sign_test_p" (two-sided exact
    binomial test of the signs against 1/2)}.
    """
    contrasts = np.asarray(contrasts, np.float64)
    positive, negative = int((contrasts > 0).sum()), int((contrasts < 0).sum())
    nonzero = positive + negative
    tail = sum(math.comb(nonzero, k) for k in range(min(positive, negative) + 1)) / 2**nonzero if nonzero else 1.0
    return {
        "num_runs": int(contrasts.size),
        "num_positive": positive,
        "num_negative": negative,
        "share_same_sign": max(positive, negative) / nonzero if nonzero else None,
        "sign_test_p": min(1.0, 2 * tail),
    }


def contrast_across_runs(runs, permutations=NUM_PERMUTATIONS, seed=0) -> dict:
    """
    The function/content contrast of each run's tower 0 after orienting its towers to the first run's, and the sign
    consistency of d.

    Args:
        runs: one dict per run (seed) with "token_ids" [types], "preference_nats" [towers, types] and "tags" [types]
            (UPOS; any tag outside FUNCTION_TAGS and CONTENT_TAGS is left out of the contrast).

    Returns:
        {"runs": [the run's contrast (function_content_contrast) with its "tower_mapping" and "matched_correlation"
        with the first run], "sign_consistency": sign_consistency of the d}.
    """
    if not runs:
        raise ValueError("contrast_across_runs needs at least one run.")
    reference = runs[0]
    results = []
    for run in runs:
        oriented, mapping, correlation = orient_towers(
            run["token_ids"], run["preference_nats"], reference["token_ids"], reference["preference_nats"]
        )
        contrast = function_content_contrast(oriented[0], run["tags"], permutations, seed)
        results.append(contrast | {"tower_mapping": mapping, "matched_correlation": correlation})
    return {"runs": results, "sign_consistency": sign_consistency([run["d_nats"] for run in results])}


def _difference(values, is_function) -> float:
    return float(values[is_function].mean() - values[~is_function].mean())


def _checked(preference, tags):
    preference = np.asarray(preference, np.float64)
    tags = np.asarray(tags, dtype=object).astype(str)
    if preference.ndim != 1 or tags.shape != preference.shape:
        raise ValueError(
            f"pass one tower's preference [types] and one tag per type; got shapes {preference.shape} and "
            f"{tags.shape}."
        )
    if not np.isfinite(preference).all():
        raise ValueError("the preference has NaN or infinite values.")
    return preference, tags


__all__ = [
    "CONTENT_TAGS",
    "FUNCTION_TAGS",
    "contrast_across_runs",
    "function_content_contrast",
    "orient_towers",
    "parts_of_speech_summary",
    "sign_consistency",
    "tag_preferences",
]
