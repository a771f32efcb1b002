"""Sentence-pair blocks against the reference code (hezq06/twotower_lm, ttlm/datautil.py WikiBookDatasetBert), and
the padding they bring: never attended to, never a target, never cached, never in the validation loss.
"""

import random
from functools import partial
from types import SimpleNamespace

import numpy as np

import pytest
import torch
from accelerate import Accelerator
from datasets import DatasetDict
from torch.nn import functional as F
from torch.utils.data import DataLoader

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.towers_transformer import TwoTowerTransformerTowers
from twotower.evaluation.scoring.score import collate_scored_blocks
from twotower.evaluation.scoring.engine import score_blocks
from twotower.training.data.blocks import (
    collate_blocks,
    load_raw_datasets,
    make_dataloaders,
    sentence_pair_blocks,
    sentence_pair_tokens,
    tokenize_and_group,
)
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.data.objectives import make_collators, predicting_positions, prediction_targets
from twotower.training.feature_cache.probe_cache import build_feature_cache
from twotower.training.data.tokenizer import load_tokenizer, padded_vocab_size
from twotower.training.phases.validation import evaluate_blocks

BLOCK_SIZE = 16
# Three blocks of 16 from anchors 0, 16 and 32: two segments split at the first of two sentence ends equally near
# their middle; a sentence longer than the block, cut; one sentence and padding. The anchor at 48 runs off the text.
PLANTED_TEXT = (
    "the end. a cat sat. the dog ran far away. birds sing! then rain fell on the old town? we left at noon and "
    "walked along the river until the sun went down over the hills. one more line here. tail words keep going on "
    "and on for the whole rest of this test text. last."
)
PLANTED_BLOCKS = [
    "[CLS] a cat sat . [SEP] the dog ran far away . birds sing ! [SEP]",
    "[CLS] we left at noon and walked along the river until the sun went down over",
    "[CLS] one more line here . [SEP] [PAD] [PAD] [PAD] [PAD] [PAD] [PAD] [PAD] [PAD] [PAD]",
]


@pytest.fixture(scope="module")
def bert_tokenizer(shared_data):
    return load_tokenizer(str(shared_data / "tokenizers" / "bert-base-uncased"))


@pytest.fixture(scope="module")
def wikitext_blocks(shared_data, bert_tokenizer, tmp_path_factory):
    """Sentence-pair blocks of 64 tokens from 60 kB of WikiText-2, as the training command builds them."""
    text = (shared_data / "wikitext-2" / "train.txt").read_text(encoding="utf-8")[:60_000]
    path = tmp_path_factory.mktemp("sentence-pairs") / "train.txt"
    path.write_text(text.rsplit("\n", 1)[0] + "\n", encoding="utf-8")
    raw = load_raw_datasets("unused", None, str(path))
    return tokenize_and_group(raw, bert_tokenizer, 64, block_format="sentence_pairs")["train"]


def test_sentence_pair_blocks_lay_out_the_reference_format(bert_tokenizer, tmp_path):
    (tmp_path / "planted.txt").write_text(PLANTED_TEXT + "\n", encoding="utf-8")
    raw = load_raw_datasets("unused", None, str(tmp_path / "planted.txt"))
    blocks = tokenize_and_group(raw, bert_tokenizer, BLOCK_SIZE, block_format="sentence_pairs")["train"]
    assert [" ".join(bert_tokenizer.convert_ids_to_tokens(ids)) for ids in blocks["input_ids"]] == PLANTED_BLOCKS
    assert blocks["attention_mask"] == [[1] * 16, [1] * 16, [1] * 7 + [0] * 9]
    # the reference's sentence ends, and its special ids (datautil.py: 0 [PAD], 101 [CLS], 102 [SEP])
    assert sentence_pair_tokens(bert_tokenizer) == {"ends": {1012, 999, 1029}, "cls": 101, "sep": 102, "pad": 0}


def scanned_blocks(stream: list[int], window: int, ends: set, cls: int, sep: int) -> list[list[int]]:
    """
    The reference's rule, computed by walking the stream token by token: from each anchor, skip past the first
    sentence end; collect sentence ends until one lies 3 or fewer tokens short of a window from the start or later;
    then lay out [CLS] + the window's first window - 1 tokens (one end found), [CLS] sentence [SEP] (two), or [CLS]
    sentences [SEP] sentences [SEP] split at the end nearest the middle of the sentences that fit (three or more).
    """
    blocks = []
    for anchor in range(0, len(stream), window):
        position = anchor
        while position < len(stream) and stream[position] not in ends:
            position += 1
        start = position + 1
        found, last, position = [], start, start
        while last < start + window - 3 and position < len(stream):
            if stream[position] in ends:
                found.append(position)
                last = position
            position += 1
        if not found or found[-1] < start + window - 3 or (len(found) == 1 and start + window - 1 > len(stream)):
            return blocks  # ran off the stream
        if len(found) == 1:
            blocks.append([cls] + stream[start : start + window - 1])
        elif len(found) == 2:
            blocks.append([cls] + stream[start : found[0] + 1] + [sep])
        else:
            middle = start + int((found[-2] - start) / 2)
            distances = [abs(end - middle) for end in found[:-2]]
            split = found[distances.index(min(distances))]
            blocks.append([cls] + stream[start : split + 1] + [sep] + stream[split + 1 : found[-2] + 1] + [sep])
    return blocks


@pytest.mark.parametrize("window", [8, 16, 33])
@pytest.mark.parametrize("end_rate", [0.03, 0.1, 0.3])
def test_sentence_pair_blocks_equal_a_token_by_token_scan(window, end_rate):
    rng = random.Random(window * 1000 + int(end_rate * 100))
    for _ in range(20):
        stream = [1 if rng.random() < end_rate else rng.randrange(5, 50) for _ in range(rng.randrange(30, 400))]
        expected = scanned_blocks(stream, window, {1}, cls=2, sep=3)
        assert sentence_pair_blocks(stream, window, {1}, cls_id=2, sep_id=3) == expected
        assert all(len(block) <= window for block in expected)


def test_sentence_pairs_need_the_special_tokens(shared_data):
    gpt2 = load_tokenizer(str(shared_data / "tokenizers" / "gpt2"))
    with pytest.raises(TwoTowerUserError, match=r"needs \[CLS\], \[SEP\] and \[PAD\].*cls_token, sep_token, pad_token"):
        sentence_pair_tokens(gpt2)


def test_padding_is_never_a_target_and_special_tokens_never_masked(wikitext_blocks, bert_tokenizer):
    examples = [wikitext_blocks.with_format("torch")[index] for index in range(len(wikitext_blocks))]
    padding = torch.stack([example["input_ids"] for example in examples]) == bert_tokenizer.pad_token_id
    assert padding.any(), "the test needs padded blocks"

    batch = collate_blocks(examples)  # causal and ELMo-style towers: every token but the padding is a target
    assert torch.equal(batch["attention_mask"] == 0, padding)
    assert torch.equal(batch["labels"] == -100, padding)

    masking, _ = make_collators("masked", TwoTowerTransformerTowers, bert_tokenizer, 0.15, seed=3)
    masked = masking(examples)
    assert torch.equal(masked["attention_mask"], batch["attention_mask"])
    special = sum(batch["input_ids"] == bert_tokenizer.convert_tokens_to_ids(token) for token in ("[CLS]", "[SEP]"))
    selected = masked["labels"] != -100
    assert not (selected & (padding | special.bool())).any()  # as the reference, model.py input_masking
    ordinary = ~padding & ~special.bool()
    assert selected.sum().item() / ordinary.sum().item() == pytest.approx(0.15, abs=0.02)
    assert torch.equal(masked["labels"][selected], batch["input_ids"][selected])


def tiny_model(model_class, tokenizer, **overrides):
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset(
        "tiny", vocab_size=padded_vocab_size(tokenizer), hidden_size=16, num_attention_heads=2, intermediate_size=24,
        num_hidden_layers=1, max_position_embeddings=64, **overrides,
    )  # fmt: skip
    return model_class(config).eval()


@pytest.mark.parametrize("objective", ["causal", "masked"])
def test_validation_loss_and_probe_cache_leave_the_padding_out(objective, wikitext_blocks, bert_tokenizer):
    model = tiny_model({"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}[objective], bert_tokenizer)
    collator, _ = make_collators(objective, TwoTowerTransformerTowers, bert_tokenizer, 0.15, seed=3)
    blocks = wikitext_blocks.select(range(12))
    batch = collator([example for example in blocks.with_format("torch")])
    targets = prediction_targets(batch["labels"], objective)
    scored = targets != -100

    # Directly: the model over the blocks with their attention mask, its loss on the labelled positions.
    with torch.no_grad():
        logits = predicting_positions(model(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits,
                                      objective, seq_dim=1)  # fmt: skip
        unmasked = predicting_positions(model(input_ids=batch["input_ids"]).logits, objective, seq_dim=1)
        features = predicting_positions(model.probe_features(batch["input_ids"], batch["attention_mask"]),
                                        objective, seq_dim=2)  # fmt: skip
    expected_loss = F.cross_entropy(logits[scored], targets[scored]).item()
    ignoring_the_mask = F.cross_entropy(unmasked[scored], targets[scored]).item()
    if objective == "masked":  # bidirectional: without the mask every position would read the padding
        assert abs(expected_loss - ignoring_the_mask) > 1e-4
    else:  # causal: the padding comes last, so no scored position could read it anyway
        assert expected_loss == ignoring_the_mask

    _, loader = make_dataloaders(DatasetDict({"train": blocks, "validation": blocks}), 8, 8, collator, collator)
    assert evaluate_blocks(Accelerator(cpu=True), model, loader)["loss"] == pytest.approx(expected_loss, rel=1e-5)

    cache = build_feature_cache(Accelerator(cpu=True), model, blocks, collator, objective, batch_size=8)
    assert torch.equal(cache.targets, targets[scored])  # no padding position, no [CLS] among the targets
    assert bert_tokenizer.pad_token_id not in cache.targets.tolist()
    torch.testing.assert_close(cache.features.transpose(0, 1), features[:, scored], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", ["causal", "masked", "elmo"])
def test_scoring_reads_each_real_token_once_and_never_the_padding(family, wikitext_blocks, bert_tokenizer):
    model_class = TwoTowerForCausalLM if family == "causal" else TwoTowerForMaskedLM
    overrides = dict(tower_type="lstm", lstm_hidden_size=24) if family == "elmo" else {}
    model = tiny_model(model_class, bert_tokenizer, **overrides)
    special = [bert_tokenizer.cls_token_id, bert_tokenizer.sep_token_id]
    unscored = special if family == "masked" else []  # a masked LM never predicts [CLS] or [SEP]
    blocks = wikitext_blocks.select(range(6))
    collate = partial(collate_scored_blocks, unscored_ids=unscored)
    loader = DataLoader(blocks.with_format("torch"), batch_size=4, collate_fn=collate)
    fed = []  # the gold token id of every scored position, as the engine feeds an accumulator
    accumulator = SimpleNamespace(update=lambda token_ids, gold_logprobs: fed.extend(token_ids.tolist()))
    score_blocks(model, loader, accumulators=[accumulator], mask_passes=7, mask_token_id=bert_tokenizer.mask_token_id)
    scored = np.array(fed)
    expected = []
    for ids, mask in zip(blocks["input_ids"], blocks["attention_mask"]):
        real = ids[: sum(mask)][1 if family == "causal" else 0 :]  # a causal LM never predicts the first token
        expected += [token for token in real if token not in unscored]
    assert sorted(scored.tolist()) == sorted(expected)
    assert bert_tokenizer.pad_token_id not in scored.tolist()
