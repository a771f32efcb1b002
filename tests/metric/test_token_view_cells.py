"""
Every cell of the token view has a working hover card: a real tiny model scores a text holding a cell of each class
(ASCII, a character of merged byte pieces, an emoji, CJK, right-to-left Hebrew, a zero-width-joiner sequence), and
headless Chromium hovers one of each and reads its card against the model run directly, with no page error. Skipped
where Chromium or Playwright is missing (conftest.py's `chromium`).
"""

import json
import re

import numpy as np
import pytest
import torch
from transformers.convert_slow_tokenizer import bytes_to_unicode

from conftest import tiny_two_tower
from modeling_twotower import TwoTowerForCausalLM
from twotower.evaluation.scoring.score import score_model
from twotower.training.data.tokenizer import padded_vocab_size, train_bpe_tokenizer

# the tokenizer learns the English only, so every other character is byte pieces
TOKENIZER_TEXT = "The cat sat on the mat, she said.\n" * 50
FAMILY = "\U0001f469\u200d\U0001f469\u200d\U0001f467"  # woman, zero-width joiner, woman, joiner, girl: one character
TEXT = f"The cat sat. “Où” naïve café 🐈 東京 שלום {FAMILY} end.\n" * 3
BLOCK_SIZE, MIN_COUNT = 32, 2
CELLS = {  # class: the text of a cell of that class
    "ASCII": "The",
    "merged byte pieces (accent)": "ï",
    "merged byte pieces (curly quote)": "“",
    "emoji": "🐈",
    "CJK": "京",
    "RTL": "ל",
    "zero-width joiner sequence": FAMILY,
}
BYTE_TOKEN = bytes_to_unicode()  # byte -> the character byte-level BPE writes for it
SPAN_INDEX = """(text) => Array.from(document.querySelectorAll('.token.scored')).findIndex((s) => s.textContent === text)"""
NUMBER = re.compile(r"-?\d+\.\d+")
# the page keeps 4 decimals of each log-probability and the card shows 3, so a figure can differ by one in the last
# decimal from the model's, rounded once
CARD_DECIMALS_TOLERANCE = 1.1e-3


def assert_reads(shown: str, expected: str, name: str):
    """The card's line reads as expected: the same words, and every figure within CARD_DECIMALS_TOLERANCE."""
    assert NUMBER.sub("#", shown) == NUMBER.sub("#", expected), name
    for value, expected_value in zip(NUMBER.findall(shown), NUMBER.findall(expected), strict=True):
        assert float(value) == pytest.approx(float(expected_value), abs=CARD_DECIMALS_TOLERANCE), name


@pytest.fixture(scope="module")
def scored_text(tmp_path_factory):
    """The report of TEXT scored by a tiny model with 2 probe replicas a tower, and that model's blocks and tokenizer."""
    folder = tmp_path_factory.mktemp("cells")
    tokenizer = train_bpe_tokenizer(iter([TOKENIZER_TEXT.splitlines(keepends=True)]), vocab_size=400)
    model = tiny_two_tower(vocab_size=padded_vocab_size(tokenizer), probe_replicas=2)
    model.config.probe_training_steps = 1  # as the probe phase records; the probes stay as drawn
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "text.txt").write_text(TEXT, encoding="utf-8")
    score_model(folder / "model", folder / "report", validation_file=str(folder / "text.txt"), block_size=BLOCK_SIZE,
                token_view_blocks=10**6, min_count=MIN_COUNT, ablation=False, parts_of_speech=False)
    ids = tokenizer(TEXT)["input_ids"]
    blocks = torch.tensor(ids[: len(ids) // BLOCK_SIZE * BLOCK_SIZE]).view(-1, BLOCK_SIZE)  # the whole blocks
    model = TwoTowerForCausalLM.from_pretrained(folder / "model").eval()
    with torch.no_grad():
        tower_logprobs = model.probe_logprobs(blocks).numpy()  # [towers, blocks, seq - 1], each the replicas' mean
    return {"folder": folder, "tokenizer": tokenizer, "blocks": blocks.numpy(), "tower_logprobs": tower_logprobs}


def expected_card(scored_text, passage, position, text):
    """The card's lines for the cell `text` whose last token is at (passage, position), from the model run directly."""
    blocks, tower_logprobs = scored_text["blocks"], scored_text["tower_logprobs"]
    token_id = int(blocks[passage, position])
    targets = blocks[:, 1:]  # every block's first token is not predicted
    here = tower_logprobs[:, passage, position - 1]
    occurrences = targets == token_id
    preference = float((tower_logprobs[0] - tower_logprobs[1])[occurrences].mean())  # tower 0 minus tower 1
    tower = 0 if preference > 0 else 1
    counts = np.bincount(targets.ravel())
    token = scored_text["tokenizer"].convert_ids_to_tokens(token_id)
    label = token.replace("Ġ", "␣") if text.isascii() else "⟨" + text.encode("utf-8")[-1:].hex().upper() + "⟩"
    return {
        "token_id": token_id,
        "token": f"{json.dumps(text, ensure_ascii=False)} token {label}, id {token_id}",
        "logprobs": f"Log-probability here: tower 0 {here[0]:.3f}, tower 1 {here[1]:.3f} nats (each tower: the mean "
                    "of its probe replicas)",
        "preference": f"Decodable from the tower (probes): the type, seen {occurrences.sum()} times, is predicted "
                      f"better from tower {tower} by {abs(preference):.3f} nats",
        "significance": f"Beyond probe noise, after Benjamini-Hochberg over the {(counts >= MIN_COUNT).sum()} eligible "
                        "types at alpha = 0.05: ",
    }


def test_every_class_of_cell_has_its_hover_card(scored_text, chromium):
    context = chromium.new_context(offline=True, viewport={"width": 1100, "height": 800})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto((scored_text["folder"] / "report" / "tokens.html").as_uri())
    card = page.locator("#card")
    for name, text in CELLS.items():
        index = page.evaluate(SPAN_INDEX, text)
        assert index >= 0, f"no scored cell {text!r} ({name})"
        span = page.locator(".token.scored").nth(index)
        passage, position = int(span.get_attribute("data-passage")), int(span.get_attribute("data-position"))
        expected = expected_card(scored_text, passage, position, text)
        if not text.isascii():  # the cell's last token is the character's last byte
            last_byte = text.encode("utf-8")[-1]
            assert expected["token_id"] == scored_text["tokenizer"].convert_tokens_to_ids(BYTE_TOKEN[last_byte])
        span.hover()
        assert card.is_visible(), name
        assert card.locator("[data-field=token]").inner_text() == expected["token"], name
        assert_reads(card.locator("[data-field=logprobs]").inner_text(), expected["logprobs"], name)
        preference = card.locator("[data-field=preference]").inner_text()
        assert_reads(preference.split(" (95% interval")[0], expected["preference"], name)
        assert card.locator("[data-field=significance]").inner_text().startswith(expected["significance"]), name
        pieces = card.locator("[data-field=pieces]")
        if text.isascii():
            assert pieces.count() == 0, name
        else:  # one token per byte: the BPE learned no merge of these characters
            assert pieces.inner_text().startswith(f"One character, {len(text.encode('utf-8'))} tokens"), name
        if name in ("RTL", "zero-width joiner sequence"):  # what a person sees: kept beside the test's other files
            page.screenshot(path=scored_text["folder"] / f"hover_{name.split()[0]}.png")
    # "The" opens every line of the text: after a newline, a piece without the space marker starts a word
    page.locator(".token.scored").nth(page.evaluate(SPAN_INDEX, "The")).hover()
    assert card.locator("[data-field=categories]").inner_text().startswith("kind: word-initial")
    assert errors == []

    # the filter counts tokens, as the heading does, not cells (a character of byte pieces is one cell)
    shown = int(page.locator("#shown-count").inner_text())
    assert shown == scored_text["blocks"].shape[0] * (BLOCK_SIZE - 1) > page.locator(".token.scored").count()
    assert page.locator("#match-count").inner_text() == f"{shown} of {shown} scored tokens match"
    context.close()
