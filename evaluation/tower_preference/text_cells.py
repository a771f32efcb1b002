"""Text by character spans: the cells of the token view, and token strings a reader can read.

A byte-level BPE splits a character it has not merged (a curly quote, an accented letter, CJK, an emoji) into byte
tokens, and a byte decoded alone is no character: decoding token by token writes U+FFFD. So the token view writes
*cells*: runs of consecutive tokens whose decoded text ends where a character a reader sees ends (most cells are one
token; the byte pieces of one character are one cell, and so is a sequence that reads as one character, such as an
emoji joined by zero-width joiners or a letter and its combining accent), each with the text that the run adds to the
decoded passage. A zero-width joiner alone in a cell would be a box of no width, which no pointer can hover.
"""

import regex
from transformers.convert_slow_tokenizer import bytes_to_unicode


SPACE_MARK, NEWLINE_MARK, TAB_MARK = "\u2423", "\u23ce", "\u21e5"  # ␣ ⏎ ⇥: whitespace made visible
BYTE_OF_CHARACTER = {character: byte for byte, character in bytes_to_unicode().items()}  # byte-level BPE alphabet


CONTEXT_TOKENS = 8  # tokens decoded before a cell: what WordPiece's spacing and byte-level pieces depend on


def text_cells(tokenizer, token_ids) -> list[tuple[list[int], str]]:
    """(token indices, text) of each cell of `token_ids`; the texts joined are the decoded sequence.

    A run of tokens ends a cell when the text it adds (decoded after CONTEXT_TOKENS tokens before it, less what those
    decode to) is the whole decoded text's at that place: no partial character at its end. The rare tokenizer whose
    decoding depends on more context than that is cut by decoding every prefix instead (quadratic in the length).
    Cells that end inside a grapheme cluster (Unicode's user-perceived character) are then joined with the next.
    """
    token_ids = list(token_ids)
    whole = tokenizer.decode(token_ids, clean_up_tokenization_spaces=False)
    cells, pending, written = [], [], 0
    for end in range(1, len(token_ids) + 1):
        pending.append(end - 1)
        if end == len(token_ids):
            cells.append((pending, whole[written:]))
            break
        context = max(0, pending[0] - CONTEXT_TOKENS)
        before = tokenizer.decode(token_ids[context : pending[0]], clean_up_tokenization_spaces=False)
        added = tokenizer.decode(token_ids[context:end], clean_up_tokenization_spaces=False)
        if added.startswith(before) and whole.startswith(added[len(before) :], written):
            cells.append((pending, added[len(before) :]))
            pending, written = [], written + len(added) - len(before)
    if "".join(text for _, text in cells) != whole:
        cells = _cells_by_prefixes(tokenizer, token_ids, whole)
    return _whole_graphemes(cells, whole)


def _whole_graphemes(cells, whole):
    """The cells joined so that each ends where a grapheme cluster of `whole` ends (regex's \\X)."""
    ends = {match.end() for match in regex.finditer(r"\X", whole)}
    joined, pending, text, written = [], [], "", 0
    for indices, cell_text in cells:
        pending, text, written = pending + indices, text + cell_text, written + len(cell_text)
        if written in ends or written == len(whole):
            joined.append((pending, text))
            pending, text = [], ""
    return joined


def _cells_by_prefixes(tokenizer, token_ids, whole):
    cells, pending, written = [], [], 0
    for end in range(1, len(token_ids) + 1):
        pending.append(end - 1)
        decoded = tokenizer.decode(token_ids[:end], clean_up_tokenization_spaces=False)
        if end == len(token_ids) or (len(decoded) >= written and whole.startswith(decoded)):
            text = whole[written:] if end == len(token_ids) else decoded[written:]
            cells.append((pending, text))
            pending, written = [], written + len(text)
    return cells


def passage_cells(tokenizer, passages) -> list[list[dict]]:
    """Per passage, its cells as {"positions": [[passage, position], ...], "text"}: the passages' tokens are read as
    one text, so that a character split between two passages is one cell, in the passage where it ends."""
    owners = [(index, position) for index, passage in enumerate(passages) for position in range(len(passage))]
    token_ids = [token_id for passage in passages for token_id in passage]
    cells = [[] for _ in passages]
    for indices, text in text_cells(tokenizer, token_ids):
        positions = [list(owners[index]) for index in indices]
        cells[positions[-1][0]].append({"positions": positions, "text": text})
    return cells


def with_cells(tokenizer, passages: list[dict]) -> list[dict]:
    """The token view's passages (dicts with "token_ids") with their "cells" (`passage_cells`) added."""
    cells = passage_cells(tokenizer, [passage["token_ids"] for passage in passages])
    return [passage | {"cells": passage_cells} for passage, passage_cells in zip(passages, cells, strict=True)]


def readable_token(token: str, byte_level: bool | None = None) -> str:
    """A token string as text: byte-level BPE pieces decoded (`ĠGremio` reads ` Gremio`), with whitespace made
    visible (␣ for a space, ⏎, ⇥), and a byte that is only part of a character written as its hex value (⟨E2 80⟩).
    A string outside the byte-level alphabet (WordPiece, SentencePiece) is shown as it is, with ▁ as ␣.
    `byte_level` (`is_byte_level(tokenizer)`): None guesses from the string (a lone Latin-1 letter reads as text)."""
    if token and all(character in BYTE_OF_CHARACTER for character in token):
        raw = bytes(BYTE_OF_CHARACTER[character] for character in token)
        try:
            token = raw.decode("utf-8")
        except UnicodeDecodeError:
            if not byte_level and not any(ord(character) > 0xFF for character in token):  # e.g. WordPiece's "é": text already
                return visible_whitespace(token)
            return "\u27e8" + raw.hex(" ").upper() + "\u27e9"
    return visible_whitespace(token.replace("\u2581", " "))


def visible_whitespace(text: str) -> str:
    return text.replace(" ", SPACE_MARK).replace("\n", NEWLINE_MARK).replace("\t", TAB_MARK)


def is_byte_level(tokenizer) -> bool:
    """Whether a (fast) tokenizer decodes byte-level BPE pieces (GPT-2's, the package's trained tokenizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"
