"""Token categories: kinds of real GPT-2 and BERT vocabulary strings, frequency bands, and per-category preferences."""

import json

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats
from transformers import GPT2TokenizerFast

from twotower.evaluation.scoring import token_categories
from twotower.evaluation.scoring.token_categories import (
    WordStarts,
    categorize,
    category_preferences,
    detect_scheme,
    frequency_band,
    letter_case,
    part_of_speech,
    plot_category_preferences,
    token_kind,
)


# hand-checked: (token as in the vocabulary, expected kind)
GPT2_KINDS = [
    ("Ġthe", "word-initial"),
    ("ĠThe", "word-initial"),
    ("ing", "continuation"),
    ("'s", "continuation"),
    ("Ã©", "continuation"),  # "é" as two bytes: a letter
    ("ĠcafÃ©", "word-initial"),  # " café"
    (",", "punctuation"),
    ("Ġ(", "punctuation"),
    ("Ġ$", "punctuation"),
    ("âĢĶ", "punctuation"),  # em dash, three bytes
    ("Ġ1990", "digits"),
    ("5", "digits"),
    ("Ċ", "whitespace"),
    ("ĊĊ", "whitespace"),
    ("Ġ", "whitespace"),
    ("ĉ", "whitespace"),  # tab
    ("<|endoftext|>", "special"),
    ("âĢ", "byte fragment"),  # the first two of three bytes of quotes and dashes
    ("Ã", "byte fragment"),
]
BERT_KINDS = [
    ("the", "word-initial"),
    ("ß", "word-initial"),
    ("##ing", "continuation"),
    ("##s", "continuation"),
    (",", "punctuation"),
    ("$", "punctuation"),
    ("1990", "digits"),
    ("##2", "digits"),
    ("½", "digits"),
    ("[CLS]", "special"),
    ("[MASK]", "special"),
    ("[unused0]", "special"),
]


@pytest.fixture(scope="module")
def gpt2_vocab(gpt2_tokenizer_dir):
    return list(json.loads((gpt2_tokenizer_dir / "vocab.json").read_text(encoding="utf-8")))


@pytest.fixture(scope="module")
def bert_vocab(shared_data):
    return (shared_data / "tokenizers" / "bert-base-uncased" / "vocab.txt").read_text(encoding="utf-8").splitlines()


def test_byte_decoder_inverts_gpt2_byte_map():
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    assert token_categories.BYTE_DECODER == {character: byte for byte, character in bytes_to_unicode().items()}


@pytest.mark.parametrize("token, kind", GPT2_KINDS)
def test_byte_level_kinds_of_gpt2_tokens(gpt2_vocab, token, kind):
    assert token in gpt2_vocab
    assert token_kind(token, "byte_level") == kind


@pytest.mark.parametrize("token, kind", BERT_KINDS)
def test_wordpiece_kinds_of_bert_tokens(bert_vocab, token, kind):
    assert token in bert_vocab
    assert token_kind(token, "wordpiece") == kind


def test_special_tokens_argument_and_bad_inputs():
    assert token_kind("endoftext", "byte_level") == "continuation"
    assert token_kind("endoftext", "byte_level", special_tokens={"endoftext"}) == "special"
    assert token_kind("<pad>", "wordpiece") == "special"
    assert token_kind("<", "byte_level") == "punctuation"  # a bracket alone is not a special token
    with pytest.raises(ValueError, match="scheme='sentencepiece'"):
        token_kind("the", "sentencepiece")
    with pytest.raises(ValueError, match="not a byte-level BPE token"):
        token_kind("日本", "byte_level")


def test_a_piece_that_opens_a_line_is_word_initial(gpt2_tokenizer_dir):
    tokenizer = GPT2TokenizerFast.from_pretrained(gpt2_tokenizer_dir)
    vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    verse = ("O Romeo, Romeo!\nA plague o' both your houses!\nO, I am slain.\n"
             "A thousand times good night; Benvolio, Mercutio.\n")
    ids = tokenizer(verse)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids)[5:7] == ["Ċ", "A"]  # no space marker after a newline
    word_starts = WordStarts(vocabulary, "byte_level")
    word_starts.begin_batch({"input_ids": torch.tensor([ids[:18], ids[18:36]])})  # two blocks of the text
    pieces = ["O", "A", "vol", "io"]  # after a newline ("O" opens the text too, uncounted); inside names
    table = pd.DataFrame({"token_id": tokenizer.convert_tokens_to_ids(pieces), "token": pieces, "count": 2})
    kinds = categorize(table, "byte_level", follows_whitespace=word_starts.types())["kind"]
    assert kinds == ["word-initial", "word-initial", "continuation", "continuation"]
    assert categorize(table, "byte_level")["kind"] == ["continuation"] * 4  # from the strings alone
    # a type that opens a line in 1 of its 3 occurrences stays a continuation
    mostly_inside = WordStarts(vocabulary, "byte_level")
    ids = tokenizer("Ben\nio Mercutio Benvolio")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == ["Ben", "Ċ", "io", "ĠMerc", "ut", "io", "ĠBen", "vol", "io"]
    mostly_inside.begin_batch({"input_ids": torch.tensor([ids])})
    assert tokenizer.convert_tokens_to_ids("io") not in mostly_inside.types()


def test_detect_scheme(gpt2_vocab, bert_vocab):
    assert detect_scheme(gpt2_vocab) == "byte_level"  # GPT-2 has "##" tokens too, and "Ġ" ones
    assert detect_scheme(bert_vocab) == "wordpiece"
    with pytest.raises(ValueError, match="pass scheme="):
        detect_scheme(["▁the", "▁cat"])


def test_frequency_band_ranks_with_ties():
    counts = np.array([40, 50, 40, 40, 10, 30, 30])  # ranks (method "min"): 2, 1, 2, 2, 7, 5, 5
    bands = frequency_band(counts, edges=(2, 5))
    # the three tied 40s all share rank 2, so "top 2" holds four types; the 30s share rank 5
    assert bands.tolist() == ["top 2", "top 2", "top 2", "top 2", "6+", "3-5", "3-5"]
    order = np.random.default_rng(0).permutation(len(counts))
    assert frequency_band(counts[order], edges=(2, 5)).tolist() == bands[order].tolist()


def test_frequency_band_default_edges():
    bands = frequency_band(np.arange(1500, 0, -1))  # distinct counts: rank = position + 1
    assert bands[:100].tolist() == ["top 100"] * 100
    assert bands[100:1000].tolist() == ["101-1000"] * 900
    assert bands[1000:].tolist() == ["1001+"] * 500
    with pytest.raises(ValueError, match="increasing positive ranks"):
        frequency_band([1, 2], edges=(1000, 100))


def planted_table():
    """Two towers. Eligible: A (20 types) all prefer tower 0, B (40) split 20/20, C (20) all prefer tower 1, so
    overall the split is 50/50. Ineligible rows (in A, and all of D) prefer tower 1 and must be ignored."""
    rng = np.random.default_rng(0)
    categories = ["A"] * 20 + ["B"] * 40 + ["C"] * 20 + ["A"] * 5 + ["D"] * 3
    preferred = np.array([0] * 20 + [0, 1] * 20 + [1] * 20 + [1] * 8)
    magnitude = rng.uniform(0.1, 2.0, len(categories))
    preference = np.where(preferred == 0, magnitude, -magnitude)  # tower 0 minus tower 1
    eligible = np.arange(len(categories)) < 80
    table = pd.DataFrame(
        {
            "token_id": np.arange(len(categories)),
            "token": [f"t{idx}" for idx in range(len(categories))],
            "count": np.where(eligible, rng.integers(5, 200, len(categories)), 2),
            "preference_nats_tower0": preference,
            "preference_nats_tower1": -preference,
            "preferred_tower": preferred,
            "p_value": np.full(len(categories), 0.5),
            "eligible": eligible,
            "significant": eligible & (magnitude > 1.0),
        }
    )
    return table, categories


def test_category_preferences_counts_means_and_tests():
    table, categories = planted_table()
    frame = category_preferences(table, categories).set_index("category")
    assert sorted(frame.index) == ["A", "B", "C"]  # D has no eligible types

    labels = np.array(categories)
    expected_p = {}
    for category, num_tower0 in (("A", 20), ("B", 20), ("C", 0)):
        rows = table[(labels == category) & table["eligible"]]
        row = frame.loc[category]
        assert row["num_types"] == len(rows)
        assert row["num_occurrences"] == rows["count"].sum()
        assert row["num_preferring_tower0"] == num_tower0
        assert row["num_preferring_tower1"] == len(rows) - num_tower0
        for tower_idx in (0, 1):
            prefers = rows[rows["preferred_tower"] == tower_idx]
            assert row[f"num_significant_tower{tower_idx}"] == prefers["significant"].sum()
            weighted = sum(c * p for c, p in zip(rows["count"], rows[f"preference_nats_tower{tower_idx}"]))
            assert row[f"mean_preference_tower{tower_idx}"] == pytest.approx(weighted / rows["count"].sum())
        expected_p[category] = stats.binomtest(num_tower0, len(rows), 0.5).pvalue
        assert row["p_value"] == pytest.approx(expected_p[category])

    assert frame.loc["A", "p_value"] < 1e-5 and frame.loc["C", "p_value"] < 1e-5
    assert frame.loc["B", "p_value"] == pytest.approx(1.0)
    # Benjamini-Hochberg by hand: A and C tie as the two smallest of three p-values
    assert frame.loc["A", "q_value"] == pytest.approx(expected_p["A"] * 3 / 2)
    assert frame.loc["B", "q_value"] == pytest.approx(1.0)


def test_category_preferences_rows_by_occurrences_and_length_check():
    table, categories = planted_table()
    frame = category_preferences(table, categories)
    assert frame["num_occurrences"].is_monotonic_decreasing
    with pytest.raises(ValueError, match="got 3 categories for a table of 88"):
        category_preferences(table, ["A", "B", "C"])


def test_category_preferences_three_towers_uses_chi_square():
    preferred = np.array([0] * 10 + [1] * 5 + [2] * 5 + [0, 1, 2] * 10)  # "X": 20 types, "Y": 30 types
    categories = ["X"] * 20 + ["Y"] * 30
    table = pd.DataFrame(
        {
            "count": np.full(50, 10),
            **{f"preference_nats_tower{t}": np.where(preferred == t, 1.0, -0.5) for t in range(3)},
            "preferred_tower": preferred,
            "eligible": np.ones(50, dtype=bool),
            "significant": np.zeros(50, dtype=bool),
        }
    )
    frame = category_preferences(table, categories).set_index("category")
    overall = np.array([20, 15, 15]) / 50
    assert frame.loc["X", "p_value"] == pytest.approx(stats.chisquare([10, 5, 5], 20 * overall).pvalue)
    assert frame.loc["Y", "p_value"] == pytest.approx(stats.chisquare([10, 10, 10], 30 * overall).pvalue)


def test_part_of_speech_none_without_tagger_data(monkeypatch):
    nltk = pytest.importorskip("nltk")

    def missing(resource):
        raise LookupError(resource)

    monkeypatch.setattr(nltk.data, "find", missing)
    assert part_of_speech(["Ġthe", "ing"]) is None
    table = pd.DataFrame({"token": ["Ġthe", "ing", ","], "count": [9, 5, 7]})
    assert categorize(table) == {
        "kind": ["word-initial", "continuation", "punctuation"],
        "frequency": ["top 100"] * 3,
        "case": ["lower-case", "lower-case", "no letters"],
    }


def test_part_of_speech_tags_word_initial_pieces_alone(monkeypatch):
    nltk = pytest.importorskip("nltk")
    tagged_sentences = []

    def fake_tagger(sentences, tagset):
        tagged_sentences.extend(sentences)
        return [[(sentence[0], f"{tagset}:{sentence[0]}")] for sentence in sentences]

    monkeypatch.setattr(nltk.data, "find", lambda resource: resource)
    monkeypatch.setattr(nltk, "pos_tag_sents", fake_tagger)
    tags = part_of_speech(["Ġthe", "ing", "ĠcafÃ©", ",", "<|endoftext|>"])
    assert tagged_sentences == [["the"], ["café"]]
    assert tags == ["universal:the", "not word-initial", "universal:café", "not word-initial", "not word-initial"]


def test_plot_category_preferences_writes_png(tmp_path):
    table, categories = planted_table()
    path = tmp_path / "categories.png"
    plot_category_preferences(category_preferences(table, categories), path, "planted categories")
    assert path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert [p.name for p in tmp_path.iterdir()] == ["categories.png"]  # no temporary file left behind
    with pytest.raises(ValueError, match="no eligible token types"):
        plot_category_preferences(category_preferences(table.assign(eligible=False), categories), path, "none")


def test_letter_case_of_byte_level_and_wordpiece_pieces():
    cases = {"ĠThe": "capitalised", "the": "lower-case", "ĠNASA": "capitalised", "ing": "lower-case",
             "Ġ,": "no letters", "12": "no letters", "<pad>": "no letters", "ĠiPhone": "lower-case"}
    assert {token: letter_case(token, "byte_level") for token in cases} == cases
    assert [letter_case(token, "wordpiece") for token in ("Paris", "##ian", "[CLS]")] == [
        "capitalised", "lower-case", "no letters"]
