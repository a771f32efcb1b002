"""Tokenizers (BERT and GPT-2 vocabulary folders, trained BPE) and text -> blocks, on the real corpora."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # tests never reach the Hub

import copy
from itertools import chain
from pathlib import Path

import pytest
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from twotower.training.data.blocks import (
    load_raw_datasets,
    make_dataloaders,
    resolve_text_files,
    split_blocks,
    tokenize_and_group,
)
from twotower.training.data.tokenizer import (
    check_tokenizer_fits,
    load_tokenizer,
    padded_vocab_size,
    train_bpe_tokenizer,
)

BPE_VOCAB_SIZE = 300


def _first_lines(path: Path, count: int) -> list[str]:
    with open(path, encoding="utf-8") as handle:
        return [next(handle) for _ in range(count)]


@pytest.fixture(scope="session")
def wikitext_train(shared_data) -> Path:
    return shared_data / "wikitext-2" / "train.txt"


@pytest.fixture(scope="module")
def bpe_tokenizer(wikitext_train):
    lines = _first_lines(wikitext_train, 2000)
    return train_bpe_tokenizer((lines[i : i + 500] for i in range(0, len(lines), 500)), BPE_VOCAB_SIZE)


def test_bert_vocabulary_folder_gives_the_papers_wordpiece(shared_data):
    tokenizer = load_tokenizer(str(shared_data / "tokenizers" / "bert-base-uncased"))
    vocabulary = (shared_data / "tokenizers" / "bert-base-uncased" / "vocab.txt").read_text().splitlines()
    assert len(tokenizer) == 30522
    assert padded_vocab_size(tokenizer) == 30528  # the paper's padded vocabulary
    ids = tokenizer("The Tower", add_special_tokens=False)["input_ids"]
    assert ids == [vocabulary.index("the"), vocabulary.index("tower")]  # uncased WordPiece


def test_gpt2_vocabulary_folder_gives_the_byte_level_bpe(shared_data):
    tokenizer = load_tokenizer(str(shared_data / "tokenizers" / "gpt2"))
    assert len(tokenizer) == 50257
    assert padded_vocab_size(tokenizer) == 50304  # nanoGPT's padded GPT-2 vocabulary
    assert tokenizer("Hello world", add_special_tokens=False)["input_ids"] == [15496, 995]
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.eos_token_id == 50256


def test_trained_bpe_is_lossless_and_reloads(bpe_tokenizer, tmp_path):
    assert len(bpe_tokenizer) == BPE_VOCAB_SIZE
    assert padded_vocab_size(bpe_tokenizer) == 320
    text = " = Valkyria Chronicles III = \n Senjō no Valkyria 3 : <unk> Chronicles\n"
    ids = bpe_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert bpe_tokenizer.decode(ids) == text  # byte-level: every character and newline survives
    assert len(ids) < len(text.encode("utf-8"))  # and merges were learned
    bpe_tokenizer.save_pretrained(tmp_path)
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
    assert reloaded.eos_token == "<|endoftext|>"


def test_tokenizer_errors_name_the_problem(shared_data, tmp_path):
    with pytest.raises(ValueError, match="tokenizer_vocab_size"):
        train_bpe_tokenizer(iter([["some text"]]), 100)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="holds no tokenizer"):
        load_tokenizer(str(tmp_path))
    gpt2 = load_tokenizer(str(shared_data / "tokenizers" / "gpt2"))
    with pytest.raises(ValueError, match="50257 tokens but the model's vocabulary has 30528"):
        check_tokenizer_fits(gpt2, 30528)


def test_text_files_from_a_file_a_folder_or_a_glob(shared_data, wikitext_train, tmp_path):
    novels = resolve_text_files(str(shared_data / "gutenberg"))
    assert len(novels) == 30 and novels == sorted(novels)
    assert resolve_text_files(str(shared_data / "gutenberg" / "pg1*_*.txt")) == [
        path for path in novels if Path(path).name.startswith("pg1")
    ]
    assert resolve_text_files(str(wikitext_train)) == [str(wikitext_train)]
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_text_files(str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match="No .txt files"):
        resolve_text_files(str(tmp_path))
    (tmp_path / "empty.txt").touch()
    with pytest.raises(ValueError, match="Empty data file"):
        resolve_text_files(str(tmp_path))
    with pytest.raises(ValueError, match="train_file"):
        load_raw_datasets("wikitext", validation_file=str(wikitext_train))


def test_blocks_are_the_running_token_stream_cut_in_order(wikitext_train, bpe_tokenizer, tmp_path):
    lines = _first_lines(wikitext_train, 60)
    (tmp_path / "train.txt").write_text("".join(lines))
    raw_datasets = load_raw_datasets("unused", train_file=str(tmp_path / "train.txt"))
    blocks = tokenize_and_group(raw_datasets, bpe_tokenizer, block_size=17)["train"]["input_ids"]

    # Independently: every line (newline included) tokenized on its own, concatenated, cut into 17s.
    stream = list(chain.from_iterable(bpe_tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines))
    assert len(blocks) == len(stream) // 17
    assert all(len(block) == 17 for block in blocks)
    assert list(chain.from_iterable(blocks)) == stream[: len(blocks) * 17]


def test_the_suite_caches_corpora_and_blocks_in_its_own_temporary_folder(wikitext_train, bpe_tokenizer, tmp_path):
    # conftest points datasets at a folder removed with the test process; a cache file anywhere else (the home
    # cache) would outlive the run, and the suite's runs filled a disk that way.
    (tmp_path / "train.txt").write_text("".join(_first_lines(wikitext_train, 60)))
    raw_datasets = load_raw_datasets("unused", train_file=str(tmp_path / "train.txt"))
    blocks = tokenize_and_group(raw_datasets, bpe_tokenizer, block_size=17)
    suite_cache = Path(os.environ["HF_DATASETS_CACHE"]).resolve()
    assert suite_cache.name.startswith("twotower-tests-datasets-")
    cache_files = [Path(f["filename"]).resolve() for d in (raw_datasets, blocks) for f in d["train"].cache_files]
    assert cache_files and all(suite_cache in path.parents for path in cache_files), cache_files


def test_lines_longer_than_the_model_become_blocks_without_a_length_warning(wikitext_train, bpe_tokenizer, tmp_path):
    lines = _first_lines(wikitext_train, 60)
    (tmp_path / "train.txt").write_text("".join(lines))
    raw_datasets = load_raw_datasets("unused", train_file=str(tmp_path / "train.txt"))
    tokenizer = copy.deepcopy(bpe_tokenizer)
    tokenizer.model_max_length = 8  # a model of 8 positions; many lines are longer
    with CaptureLogger(logging.get_logger("transformers.tokenization_utils_base")) as captured:
        blocks = tokenize_and_group(raw_datasets, tokenizer, block_size=8)["train"]["input_ids"]

    assert "longer than the specified maximum sequence length" not in captured.out
    line_ids = [bpe_tokenizer(line, add_special_tokens=False)["input_ids"] for line in lines]
    assert max(map(len, line_ids)) > 8
    assert list(chain.from_iterable(blocks)) == list(chain.from_iterable(line_ids))[: len(blocks) * 8]


def test_held_out_blocks_are_fixed_disjoint_and_sized(wikitext_train, bpe_tokenizer, tmp_path):
    (tmp_path / "train.txt").write_text("".join(_first_lines(wikitext_train, 400)))
    raw_datasets = load_raw_datasets("unused", train_file=str(tmp_path / "train.txt"))
    lm_datasets = tokenize_and_group(raw_datasets, bpe_tokenizer, block_size=32)
    first = split_blocks(lm_datasets, 32, validation_split_percentage=10)
    second = split_blocks(lm_datasets, 32, validation_split_percentage=10)
    total = len(lm_datasets["train"])
    assert len(first["validation"]) == pytest.approx(total / 10, abs=1)
    assert len(first["train"]) + len(first["validation"]) == total
    assert first["validation"]["input_ids"] == second["validation"]["input_ids"]  # same blocks every run
    train_blocks = {tuple(block) for block in first["train"]["input_ids"]}
    assert not train_blocks & {tuple(block) for block in first["validation"]["input_ids"]}
    capped = split_blocks(lm_datasets, 32, 10, max_train_blocks=5, max_eval_blocks=3)
    assert (len(capped["train"]), len(capped["validation"])) == (5, 3)


def test_too_little_text_for_one_block_fails_clearly(bpe_tokenizer, tmp_path):
    (tmp_path / "train.txt").write_text("Only a few words here.\n")
    raw_datasets = load_raw_datasets("unused", train_file=str(tmp_path / "train.txt"))
    lm_datasets = tokenize_and_group(raw_datasets, bpe_tokenizer, block_size=128)
    with pytest.raises(ValueError, match="no block of block_size=128"):
        split_blocks(lm_datasets, 128, validation_split_percentage=5)


def test_gutenberg_novels_become_batches_of_readable_blocks(shared_data):
    tokenizer = load_tokenizer(str(shared_data / "tokenizers" / "gpt2"))
    raw_datasets = load_raw_datasets("unused", train_file=str(shared_data / "gutenberg" / "pg[13][15]_*.txt"))
    lm_datasets = split_blocks(tokenize_and_group(raw_datasets, tokenizer, 128), 128, 5)
    novels_text = "".join(raw_datasets["train"]["text"])
    assert len(lm_datasets["train"]) > 500 and len(lm_datasets["validation"]) > 25
    train_dataloader, eval_dataloader = make_dataloaders(lm_datasets, 4, 8)
    batch = next(iter(train_dataloader))
    assert batch["input_ids"].shape == (4, 128)
    assert batch["labels"] is batch["input_ids"]  # the model shifts the labels itself
    assert next(iter(eval_dataloader))["input_ids"].shape == (8, 128)
    for block in batch["input_ids"]:
        assert tokenizer.decode(block[1:-1]) in novels_text  # inner tokens decode to a span of the novels
