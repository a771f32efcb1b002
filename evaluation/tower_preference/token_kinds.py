"""What kind of piece a token string is, from the string alone: the token categories' labels per token type.

`token_kind` labels a byte-level BPE or WordPiece token as word-initial, continuation, punctuation, digits, whitespace,
special or byte fragment; `letter_case` by its first letter. They need only the standard library and transformers'
byte map, so the tower_preference Space uses them beside the metric, and twotower.evaluation.scoring.token_categories
(frequency bands, part of speech, per-category tests) builds on them.
"""

import re
import unicodedata

from transformers.convert_slow_tokenizer import bytes_to_unicode


SCHEMES = ("byte_level", "wordpiece")
KINDS = ("word-initial", "continuation", "punctuation", "digits", "whitespace", "special", "byte fragment")
SPECIAL_PATTERN = re.compile(r"<[^<>]+>|\[[^\[\]]+\]")  # <|endoftext|>, <pad>, [CLS], [unused0], ...
WORD_START_MARKER = "Ġ"  # byte-level BPE's printable stand-in for a leading space (byte 0x20)
CONTINUATION_MARKER = "##"  # WordPiece's prefix for a piece inside a word


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


def token_kind(token: str, scheme: str, special_tokens=()) -> str:
    """The kind of a token string: one of KINDS.

    "special": in `special_tokens`, or fully bracketed as <...> or [...]. "whitespace": only spaces and newlines
    ("Ċ", "ĠĠ"). "word-initial" / "continuation": holds letters (or combining marks) and does / does not start a
    word. "digits": holds a number character and no letters. "punctuation": only punctuation or symbols, with or
    without the word-start marker (the few control and zero-width characters count here too). "byte fragment":
    byte-level only, holds part of a multi-byte character and no letters or digits (e.g. "âĢ", the first two bytes
    of curly quotes and dashes).

    Byte-level BPE marks only a preceding space: a piece after a newline or punctuation ("(the" -> "(", "the") has no
    marker and counts as a continuation, as the string alone cannot tell it apart from a piece inside a word.
    """
    check_scheme(scheme)
    if token in special_tokens or SPECIAL_PATTERN.fullmatch(token):
        return "special"
    text, is_word_start, is_fragment = piece_text(token, scheme)
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
