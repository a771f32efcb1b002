"""Token categories for the tower preference study: which kinds of token types each tower prefers.

A category is one label per row of a per-token table (see report.per_token_table): the piece's kind (word-initial,
continuation, punctuation, digits, whitespace, special, byte fragment), its frequency band, its letter case and, when
nltk's tagger data is installed, the universal part of speech of word-initial pieces. `category_preferences` counts,
per category, the types preferring each tower and tests whether that split differs from the split over all eligible
types.

    labels = categorize(table)  # {"kind", "frequency", "case": [...], "pos": [...] if nltk's tagger is installed}
    labels = categorize(table, follows_whitespace=word_starts.types())  # a WordStarts fed by a scoring pass
    frame = category_preferences(table, labels["kind"])
    plot_category_preferences(frame, "kind_preferences.png", "token kinds")
"""

import itertools

import numpy as np
import pandas as pd
from matplotlib import pyplot as plt
from scipy import stats

from .report import TOWER_COLORS, save_figure, tower_columns
# the labels of a single token string live beside the metric, which the Space ships; re-exported here
from ..tower_preference.token_kinds import (  # noqa: F401
    BYTE_DECODER,
    KINDS,
    SCHEMES,
    after_whitespace_counts,
    check_scheme,
    detect_scheme,
    ends_in_whitespace,
    letter_case,
    piece_text,
    token_kind,
    word_start_types,
)


NOT_WORD_INITIAL = "not word-initial"  # part-of-speech label of pieces that do not start a word
NLTK_TAGGER_DATA = ("taggers/averaged_perceptron_tagger_eng", "taggers/universal_tagset")


def frequency_band(counts, edges=(100, 1000)) -> np.ndarray:
    """[types] band of each type by frequency rank: with edges (100, 1000), "top 100", "101-1000" or "1001+".

    Rank 1 is the most frequent type. Tied counts share the best rank among them (scipy's rankdata method "min"),
    so equal counts always fall in the same band, even where that band then holds more types than its edges say.
    """
    edges = [int(edge) for edge in edges]
    if not edges or edges[0] < 1 or any(low >= high for low, high in itertools.pairwise(edges)):
        raise ValueError(f"edges={edges} must be increasing positive ranks, e.g. (100, 1000).")
    labels = [f"top {edges[0]}"]
    labels += [f"{low + 1}-{high}" for low, high in itertools.pairwise(edges)]
    labels.append(f"{edges[-1] + 1}+")
    rank = stats.rankdata(-np.asarray(counts, dtype=float), method="min")
    return np.array(labels)[np.searchsorted(edges, rank, side="left")]


class WordStarts:
    """
    Which types start words where the text has them: per type, its occurrences in the scored blocks and how many of
    them follow a piece ending in whitespace (a newline: byte-level BPE marks only a space). A PassConsumer of
    engine.score_blocks, counting each batch's blocks as it starts.
    """

    def __init__(self, tokens, scheme):
        """`tokens`: the token string of every id of the tokenizer; `scheme`: theirs (detect_scheme)."""
        self.ends_with_whitespace = np.array([ends_in_whitespace(token, scheme) for token in tokens], bool)
        self.occurrences = np.zeros(len(tokens), np.int64)
        self.after_whitespace = np.zeros(len(tokens), np.int64)

    def begin_batch(self, batch) -> None:
        input_ids = batch["input_ids"].cpu().numpy()  # [batch, seq]
        occurrences, after_whitespace = after_whitespace_counts(input_ids, self.ends_with_whitespace)
        self.occurrences += occurrences
        self.after_whitespace += after_whitespace

    def update_pass(self, scored_pass) -> None:
        pass

    def types(self) -> set[int]:
        """The ids whose occurrences mostly follow whitespace: word-initial though unmarked (token_kind)."""
        return word_start_types(self.occurrences, self.after_whitespace)


def part_of_speech(tokens, scheme=None, special_tokens=(), follows_whitespace=()) -> list[str] | None:
    """Universal part of speech (NOUN, VERB, ...) of each word-initial piece, NOT_WORD_INITIAL for other pieces.

    Each piece is tagged alone with nltk's averaged perceptron tagger, so the tag is the word's most usual part of
    speech, not its part of speech in context; a word-initial piece that is only the start of a longer word gets the
    tag of that piece. None when nltk or its tagger data is not installed (it is never downloaded).
    """
    try:
        import nltk

        for resource in NLTK_TAGGER_DATA:
            nltk.data.find(resource)
    except (ImportError, LookupError):
        return None
    tokens = [str(token) for token in tokens]
    scheme = scheme or detect_scheme(tokens)
    follows_whitespace = follows_whitespace or [False] * len(tokens)
    is_word = [
        token_kind(token, scheme, special_tokens, after) == "word-initial"
        for token, after in zip(tokens, follows_whitespace)
    ]
    words = [piece_text(token, scheme)[0] for token, word in zip(tokens, is_word) if word]
    tagged = nltk.pos_tag_sents([[word] for word in words], tagset="universal")  # one-word sentences
    tags = iter(sentence[0][1] for sentence in tagged)
    return [next(tags) if word else NOT_WORD_INITIAL for word in is_word]


def _split_p_value(preferring, overall_share):
    """p-value of the category's preferring counts [towers] against the overall shares [towers] (see below)."""
    num_types = int(preferring.sum())
    if len(preferring) == 2:
        return stats.binomtest(int(preferring[0]), num_types, float(overall_share[0])).pvalue
    observed = overall_share > 0  # a tower no eligible type prefers has no types in any category either
    if observed.sum() < 2:
        return 1.0
    return stats.chisquare(preferring[observed], num_types * overall_share[observed]).pvalue


def category_preferences(table, categories, weighted=True) -> pd.DataFrame:
    """One row per category of the eligible types: counts, preferred towers, mean preferences and a test.

    Columns: category, num_types, num_occurrences (sum of count), then per tower t num_preferring_tower{t} (types
    whose preferred_tower is t), num_significant_tower{t} (of those, the significant ones) and
    mean_preference_tower{t} (mean of preference_nats_tower{t}, weighted by count unless `weighted` is False);
    last p_value and q_value.

    p_value tests whether the category's split of preferred towers differs from the split over all eligible types,
    taking the overall shares as fixed: with two towers, a two-sided exact binomial test of the number of types
    preferring tower 0 against the overall share of tower 0 (scipy.stats.binomtest); with more towers, Pearson's
    chi-square goodness-of-fit test of the preferring counts against num_types * overall shares (scipy.stats.chisquare;
    rough when the expected counts are below 5). A category holding most types cannot differ much from the overall
    split, which it largely makes up. q_value: Benjamini-Hochberg over the categories. Rows go from the most
    occurrences to the fewest; categories with no eligible types are left out.
    """
    if len(categories) != len(table):
        raise ValueError(f"got {len(categories)} categories for a table of {len(table)} token types; pass one each.")
    eligible = table["eligible"].to_numpy(dtype=bool)
    categories = np.asarray(categories, dtype=object)[eligible]
    table = table[eligible]
    preference = tower_columns(table, "preference_nats")  # [towers, eligible types]
    num_towers = preference.shape[0]
    preferred = table["preferred_tower"].to_numpy()
    significant = table["significant"].to_numpy(dtype=bool)
    count = table["count"].to_numpy()
    overall_share = np.bincount(preferred, minlength=num_towers) / max(len(preferred), 1)

    rows = []
    for category in pd.unique(categories):
        members = categories == category
        preferring = np.bincount(preferred[members], minlength=num_towers)
        row = {"category": category, "num_types": int(members.sum()), "num_occurrences": int(count[members].sum())}
        for tower_idx in range(num_towers):
            prefers = members & (preferred == tower_idx)
            row[f"num_preferring_tower{tower_idx}"] = int(preferring[tower_idx])
            row[f"num_significant_tower{tower_idx}"] = int((prefers & significant).sum())
            weights = count[members] if weighted else None
            row[f"mean_preference_tower{tower_idx}"] = float(np.average(preference[tower_idx, members], weights=weights))
        row["p_value"] = float(_split_p_value(preferring, overall_share))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=_frame_columns(num_towers))
    if len(frame):
        frame["q_value"] = stats.false_discovery_control(frame["p_value"].to_numpy(), method="bh")
    frame = frame.sort_values(["num_occurrences", "category"], ascending=[False, True], key=_sort_key)
    return frame.reset_index(drop=True)


def _frame_columns(num_towers):
    columns = ["category", "num_types", "num_occurrences"]
    for name in ("num_preferring", "num_significant", "mean_preference"):
        columns += [f"{name}_tower{tower_idx}" for tower_idx in range(num_towers)]
    return columns + ["p_value", "q_value"]


def _sort_key(column):
    return column.astype(str) if column.name == "category" else column


def plot_category_preferences(frame, path, title):
    """Horizontal bars: per category, the share of its types preferring each tower; vertical lines: overall shares."""
    if frame.empty:
        raise ValueError(f"no categories to plot for {title!r}: category_preferences found no eligible token types.")
    preferring = tower_columns(frame, "num_preferring")  # [towers, categories]
    share = preferring / frame["num_types"].to_numpy()
    overall = np.cumsum(preferring.sum(axis=1) / frame["num_types"].sum())[:-1]  # boundaries between towers
    labels = [f"{category} ({num_types})" for category, num_types in zip(frame["category"], frame["num_types"])]
    positions = np.arange(len(frame))[::-1]  # first row on top
    figure, axis = plt.subplots(figsize=(7, 1.2 + 0.35 * len(frame)))
    left = np.zeros(len(frame))
    for tower_idx, values in enumerate(share):
        color = TOWER_COLORS[tower_idx % len(TOWER_COLORS)]
        axis.barh(positions, values, left=left, color=color, label=f"prefer tower {tower_idx}")
        left += values
    for boundary_idx, boundary in enumerate(overall):
        axis.axvline(boundary, color="black", linewidth=1.0, label="all eligible types" if boundary_idx == 0 else None)
    axis.set_yticks(positions, labels)
    axis.set_xlim(0.0, 1.0)
    axis.set_xlabel("share of the category's eligible token types (number of types in brackets)")
    axis.set_title(title)
    axis.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    save_figure(figure, path)


def categorize(table, scheme=None, special_tokens=(), follows_whitespace=()) -> dict[str, list[str]]:
    """Label columns for a per-token table: "kind", "frequency" (bands over all its types), "case" and, with nltk's
    tagger data installed, "pos". The scheme is detected from the tokens unless given. `follows_whitespace`: the ids
    of the types that mostly follow whitespace in the scored text (WordStarts.types()), word-initial though unmarked."""
    tokens = [str(token) for token in table["token"]]
    scheme = scheme or detect_scheme(tokens)
    check_scheme(scheme)
    after = [False] * len(tokens)
    if follows_whitespace:
        after = [int(token_id) in follows_whitespace for token_id in table["token_id"]]
    labels = {
        "kind": [token_kind(token, scheme, special_tokens, follows) for token, follows in zip(tokens, after)],
        "frequency": frequency_band(table["count"].to_numpy()).tolist(),
        "case": [letter_case(token, scheme) for token in tokens],
    }
    pos = part_of_speech(tokens, scheme, special_tokens, after)
    if pos is not None:
        labels["pos"] = pos
    return labels
