"""What kind of piece a token string is, from the string and where the text has it: the token categories' labels.

`token_kind` labels a byte-level BPE or WordPiece token as word-initial, continuation, punctuation, digits, whitespace,
special or byte fragment (told, for a piece without a word-start marker, whether the text has it after whitespace);
`letter_case` by its first letter. They need only numpy and transformers' byte map, so the
tower_preference Space uses them beside the metric, and twotower.evaluation.scoring.token_categories
(frequency bands, part of speech, per-category tests) builds on them.
"""

import re
import unicodedata

import numpy as np
from transformers.convert_slow_tokenizer import bytes_to_unicode


SCHEMES = ("byte_level", "wordpiece")
KINDS = ("word-initial", "continuation", "punctuation", "digits", "whitespace", "special", "byte fragment")
SPECIAL_PATTERN = re.compile(r"<[^<>]+>|\[[^\[\]]+\]")  # <|endoftext|>, <pad>, [CLS], [unused0], ...
WORD_START_MARKER = "Ġ"  # byte-level BPE's printable stand-in for a leading space (byte 0x20)
CONTINUATION_MARKER = "##"  # WordPiece's prefix for a piece inside a word
WORD_START_SHARE = 0.5  # a type more of whose occurrences than this follow whitespace starts words


# GPT-2's map from each byte to the printable character byte-level BPE writes for it, inverted
BYTE_DECODER = {character: byte for byte, character in bytes_to_unicode().items()}


def piece_text(token, scheme):
    """(text of the piece without its marker, does it start a word?, did it hold bytes that are no whole character?)"""
    if scheme == "wordpiece":
        if token.startswith(CONTINUATION_MARKER) and len(token) > len(CONTINUATION_MARKER):
            return token[len(CONTINUATION_MARKER) :], False, False
        return token, True, False  # BERT splits on whitespace and punctuation, so every other piece starts a word
    if any(character not in BYTE_DECODER for character in token):
        raise ValueError(f"{token!r} is not a byte-level BPE token (it has characters outside GPT-2's byte map).")
    raw = bytes(BYTE_DECODER[character] for character in token)
    # a piece may end (or start) inside a multi-byte character: "Ã" alone is the first byte of "é"
    text = raw.decode("utf-8", errors="ignore")
    is_fragment = len(text.encode("utf-8")) < len(raw)
    body = text.lstrip()
    return body, body != text, is_fragment


def check_scheme(scheme):
    if scheme not in SCHEMES:
        raise ValueError(f"scheme={scheme!r} is not supported; pass one of {SCHEMES} (or detect_scheme(tokens)).")


def ends_in_whitespace(token: str, scheme: str) -> bool:
    """Whether a piece's text ends in whitespace (byte-level "Ċ", ".Ċ", "ĠĠ"), so that the next piece starts a word.
    Never for WordPiece, whose pieces hold no whitespace (and mark the pieces inside a word instead)."""
    if scheme == "wordpiece" or any(character not in BYTE_DECODER for character in token):
        return False
    return bytes(BYTE_DECODER[character] for character in token).decode("utf-8", errors="ignore")[-1:].isspace()


def after_whitespace_counts(rows, ends_with_whitespace) -> tuple[np.ndarray, np.ndarray]:
    """([vocab] occurrences of each type, [vocab] how many of them follow a piece ending in whitespace) in `rows`,
    stretches of a text's ids (e.g. its blocks: a row's first token has no piece before it here);
    `ends_with_whitespace` [vocab] bool is `ends_in_whitespace` of every type."""
    vocab_size = len(ends_with_whitespace)
    occurrences, after_whitespace = np.zeros(vocab_size, np.int64), np.zeros(vocab_size, np.int64)
    for row in rows:
        row = np.asarray(row, np.int64)
        occurrences += np.bincount(row[1:], minlength=vocab_size)
        after_whitespace += np.bincount(row[1:][ends_with_whitespace[row[:-1]]], minlength=vocab_size)
    return occurrences, after_whitespace


def word_start_types(occurrences, after_whitespace) -> set[int]:
    """The types more than WORD_START_SHARE of whose occurrences follow whitespace (after_whitespace_counts)."""
    return set(np.flatnonzero(np.asarray(after_whitespace) > WORD_START_SHARE * np.asarray(occurrences)).tolist())


def token_kind(token: str, scheme: str, special_tokens=(), follows_whitespace=False) -> str:
    """The kind of a token string: one of KINDS.

    "special": in `special_tokens`, or fully bracketed as <...> or [...]. "whitespace": only spaces and newlines
    ("Ċ", "ĠĠ"). "word-initial" / "continuation": holds letters (or combining marks) and does / does not start a
    word. "digits": holds a number character and no letters. "punctuation": only punctuation or symbols, with or
    without the word-start marker (the few control and zero-width characters count here too). "byte fragment":
    byte-level only, holds part of a multi-byte character and no letters or digits (e.g. "âĢ", the first two bytes
    of curly quotes and dashes).

    Byte-level BPE marks only a preceding space: a piece after a newline ("O" at the start of a verse line) has no
    marker, and the string alone cannot tell it apart from a piece inside a word. `follows_whitespace`, that the
    type's occurrences in the text mostly follow whitespace (`word_start_types`), makes it word-initial;
    without it, and after punctuation ("(the" -> "(", "the"), such a piece counts as a continuation.
    """
    check_scheme(scheme)
    if token in special_tokens or SPECIAL_PATTERN.fullmatch(token):
        return "special"
    text, is_word_start, is_fragment = piece_text(token, scheme)
    is_word_start = is_word_start or follows_whitespace
    if not text:
        return "byte fragment" if is_fragment else "whitespace"
    classes = {unicodedata.category(character)[0] for character in text}  # L letter, M mark, N number, ...
    if classes & {"L", "M"}:
        return "word-initial" if is_word_start else "continuation"
    if "N" in classes:
        return "digits"
    return "byte fragment" if is_fragment else "punctuation"


def letter_case(token: str, scheme: str) -> str:
    """"capitalised" (first letter upper-case: "The", "NASA"), "lower-case" (first letter not upper-case: "the",
    "iPhone") or "no letters" (punctuation, digits, whitespace, special tokens); a piece inside a word counts by its
    own first letter."""
    check_scheme(scheme)
    if SPECIAL_PATTERN.fullmatch(token):
        return "no letters"
    letters = [character for character in piece_text(token, scheme)[0] if character.isalpha()]
    if not letters:
        return "no letters"
    return "capitalised" if letters[0].isupper() else "lower-case"


def detect_scheme(tokens) -> str:
    """The scheme of these token strings: "byte_level" if any has the "Ġ" marker, else "wordpiece" if any is a "##"
    piece."""
    tokens = [str(token) for token in tokens]
    if any(WORD_START_MARKER in token for token in tokens):
        return "byte_level"
    if any(token.startswith(CONTINUATION_MARKER) and len(token) > len(CONTINUATION_MARKER) for token in tokens):
        return "wordpiece"
    raise ValueError(
        f"cannot tell the tokenizer from these {len(tokens)} tokens (no 'Ġ' word-start markers, no '##' pieces); "
        f"pass scheme= one of {SCHEMES}."
    )
