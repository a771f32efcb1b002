"""
The token view writes the scored text by character spans (tower_preference/text_cells.py): in headless Chromium,
tokens.html shows no U+FFFD and its characters are the source text's, for a text of curly quotes, accented letters,
CJK and emoji and for a whole novel (Alice in Wonderland), each split by a byte-level BPE into byte pieces and cut
into blocks mid-character. Skipped where Chromium or Playwright is missing (conftest.py's `chromium`).
"""

import pytest

from conftest import tiny_two_tower
from twotower.evaluation.scoring.score import score_model
from twotower.training.data.tokenizer import padded_vocab_size, train_bpe_tokenizer

MIXED_TEXT = (
    "“Où est‐il?” she asked — ‘naïve’ Zoë’s café, déjà vu.\n東京の春は美しい。 The cat 🐈 sat; 🙂 and 👍🏽 too.\n"
    "Ελληνικά, русский, עברית: «guillemets» … ½ ° ™ ✓\n"
) * 6
PASSAGES = "() => Array.from(document.querySelectorAll('.passage')).map((p) => p.textContent)"


def score_with_drawn_probes(folder, text, tokenizer_text, block_size, min_count=2, **options):
    """`text` (folder/text.txt) scored into folder/report, every block in the token view, by a tiny model with 2
    probe replicas a tower and a byte-level BPE of 400 tokens learnt from `tokenizer_text` (folder/model); returns
    the tokenizer. `options` go to score_model."""
    tokenizer = train_bpe_tokenizer(iter([tokenizer_text.splitlines(keepends=True)]), vocab_size=400)
    model = tiny_two_tower(vocab_size=padded_vocab_size(tokenizer), probe_replicas=2)
    model.config.probe_training_steps = 1  # as the probe phase records; the probes stay as drawn
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "text.txt").write_text(text, encoding="utf-8")
    score_model(folder / "model", folder / "report", validation_file=str(folder / "text.txt"), block_size=block_size,
                token_view_blocks=10**6, min_count=min_count, ablation=False, **options)
    return tokenizer


def scored_page(tmp_path, chromium, text, tokenizer_text, block_size):
    """tokens.html of `text` scored by a tiny model (every block shown), opened offline: (each passage's text, the
    page's whole text)."""
    score_with_drawn_probes(tmp_path, text, tokenizer_text, block_size)
    context = chromium.new_context(offline=True)
    page = context.new_page()
    page.goto((tmp_path / "report" / "tokens.html").as_uri())
    shown, body = page.evaluate(PASSAGES), page.evaluate("() => document.body.innerText")
    context.close()
    return shown, body


def assert_shows_the_source(passages, body, text):
    """No U+FFFD, and the passages are the source's text, in order: the scoring command's blocks leave out only the
    remainder of each 1,000 lines (datasets' batches, grouped into blocks one batch at a time) and of the text."""
    assert "\ufffd" not in body
    cursor = 0
    for passage in passages:
        cursor = text.index(passage, cursor) + len(passage)  # ValueError where a passage is not the source's text
    assert sum(map(len, passages)) > 0.95 * len(text)


def test_the_token_view_shows_every_character_of_a_mixed_script_text(tmp_path, chromium):
    # the tokenizer learns the English only: every other character is byte pieces, many cut at a block's edge
    passages, body = scored_page(tmp_path, chromium, MIXED_TEXT, "The cat sat on the mat, she asked.\n" * 50, 16)
    assert_shows_the_source(passages, body, MIXED_TEXT)
    shown = "".join(passages)
    assert shown == MIXED_TEXT[: len(shown)]  # one batch of lines: the text up to its last whole block


@pytest.mark.slow
def test_the_token_view_of_alice_in_wonderland_is_its_text(tmp_path, chromium, shared_data):
    text = (shared_data / "gutenberg" / "pg11_alice_in_wonderland.txt").read_text(encoding="utf-8")
    passages, body = scored_page(tmp_path, chromium, text, text, 32)  # the tiny model's positions
    assert_shows_the_source(passages, body, text)
    assert "’" in "".join(passages) and "“" in "".join(passages)  # the curly quotes the byte pieces spell
