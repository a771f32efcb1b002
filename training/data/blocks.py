"""Raw text -> blocks of `block_size` token ids, through `datasets` (batched, multi-process, cached)."""

import codecs
import glob
from bisect import bisect_left, bisect_right
from itertools import accumulate, chain
from pathlib import Path

import torch
from datasets import DatasetDict, load_dataset
from datasets.exceptions import DatasetNotFoundError
from torch.utils.data import DataLoader
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ..utils.errors import TwoTowerUserError

# The held-out blocks must not change with the training seed, so runs with different seeds share a validation set.
VALIDATION_SPLIT_SEED = 0
# contiguous: the running token stream cut every block_size tokens, no special tokens. sentence_pairs: the reference
# code's blocks (hezq06/twotower_lm ttlm/datautil.py, WikiBookDatasetBert), see `sentence_pair_blocks`.
BLOCK_FORMATS = ("contiguous", "sentence_pairs")
SENTENCE_END_MARKS = (".", "!", "?")  # the reference's sentence ends: ids 1012, 999, 1029 of bert-base-uncased
TEXT_CHECK_CHUNK = 1 << 20  # bytes read at a time when checking that a data file is UTF-8 text


def data_file_paths(spec: str) -> list[Path]:
    """
    A .txt file, a folder (its *.txt files) or a glob -> sorted list of files. A path that exists is that path even
    when its name reads as a glob (`a[1].txt` is the file of that name, never `a1.txt`); only a path that does not
    exist is matched as a glob.
    """
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
        if not files:
            raise FileNotFoundError(f"No .txt files found in the data folder {spec!r}; pass a folder of .txt files.")
        return files
    if path.is_file():
        return [path]
    if not glob.has_magic(str(path)):
        raise FileNotFoundError(
            f"Data file {spec!r} does not exist; pass a .txt file, a folder of .txt files or a glob."
        )
    files = sorted(Path(match) for match in glob.glob(str(path)) if Path(match).is_file())
    if not files:
        raise FileNotFoundError(
            f"No file matches the glob {spec!r} (and no file has that name); pass a .txt file, a folder of .txt files "
            "or a glob that matches files."
        )
    return files


def resolve_text_files(spec: str) -> list[str]:
    """A .txt file, a folder (its *.txt files) or a glob -> sorted list of files, each checked to be UTF-8 text."""
    files = data_file_paths(spec)
    empty = [str(file) for file in files if file.stat().st_size == 0]
    if empty:
        raise TwoTowerUserError(f"Empty data file(s): {empty}; remove them or point to files with text.")
    for file in files:
        check_text_file(file)
    return [str(file) for file in files]


def check_text_file(path: Path) -> None:
    """
    Refuse, naming the file and the byte offset, a file `datasets` would fail on deep inside (not UTF-8) or read
    as garbage (binary), and one with nothing to learn (only whitespace). One sequential read, a chunk at a time.
    """
    convert = f"convert it to UTF-8 text first (e.g. `iconv -f latin1 -t utf-8 {path} > converted.txt`)"
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, has_text = 0, False  # offset: bytes of the file before this chunk
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(TEXT_CHECK_CHUNK):
                if (nul := chunk.find(b"\0")) >= 0:
                    raise TwoTowerUserError(
                        f"{path} is not text: a NUL byte at byte offset {offset + nul} (a binary file, or UTF-16 "
                        f"text); pass a UTF-8 text file, or {convert}."
                    )
                pending = len(decoder.getstate()[0])  # bytes of a character split across chunks
                try:
                    text = decoder.decode(chunk)
                except UnicodeDecodeError as error:
                    raise TwoTowerUserError(
                        f"{path} is not UTF-8: byte 0x{error.object[error.start]:02x} at byte offset "
                        f"{offset - pending + error.start} is not valid UTF-8; {convert}."
                    ) from error
                has_text = has_text or (bool(text) and not text.isspace())
                offset += len(chunk)
    except PermissionError as error:
        raise TwoTowerUserError(f"Cannot read data file {path} ({error.strerror}); fix its permissions.") from error
    if decoder.getstate()[0]:
        raise TwoTowerUserError(f"{path} is not UTF-8: it ends inside a multi-byte character; {convert}.")
    if not has_text:
        raise TwoTowerUserError(f"{path} holds only whitespace: nothing to train on or score; pass a file with text.")


def load_raw_datasets(
    dataset_name: str,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
) -> DatasetDict:
    """Line-per-example raw text: local files when `train_file` is set, else a Hub dataset; splits train/validation."""
    if validation_file is not None and train_file is None:
        raise TwoTowerUserError(
            "`validation_file` is set but `train_file` is not; pass both (or neither, for a Hub dataset)."
        )
    if train_file is not None:
        data_files = {"train": resolve_text_files(train_file)}
        if validation_file is not None:
            data_files["validation"] = resolve_text_files(validation_file)
        # datasets matches every data file as a glob: escaped, each names only itself. Line breaks are kept so that
        # byte-level tokenizers can learn and predict them.
        escaped = {split: [glob.escape(file) for file in files] for split, files in data_files.items()}
        return load_dataset("text", data_files=escaped, keep_linebreaks=True)
    try:
        raw_datasets = load_dataset(dataset_name, dataset_config_name)
    except (ConnectionError, DatasetNotFoundError) as error:
        config = f" ({dataset_config_name})" if dataset_config_name else ""
        raise TwoTowerUserError(
            f"Could not load the Hub dataset {dataset_name!r}{config}: {error}. Check the name and the network, or "
            f"pass --train_file/--validation_file for local text."
        ) from error
    return DatasetDict({split: raw_datasets[split] for split in ("train", "validation") if split in raw_datasets})


def sentence_pair_tokens(tokenizer: PreTrainedTokenizerBase) -> dict:
    """The ids sentence-pair blocks need: {"ends": sentence-end ids, "cls", "sep", "pad"}; a clear error if missing."""
    missing = [name for name in ("cls_token", "sep_token", "pad_token") if getattr(tokenizer, name) is None]
    if missing:
        raise TwoTowerUserError(
            f"--block_format sentence_pairs needs [CLS], [SEP] and [PAD] tokens, and {type(tokenizer).__name__} "
            f"({len(tokenizer)} tokens) has no {', '.join(missing)}; use a BERT WordPiece vocabulary (e.g. "
            f"--tokenizer_name_or_path .../bert-base-uncased) or --block_format contiguous."
        )
    ends = {token for token in range(len(tokenizer)) if tokenizer.decode([token]).strip() in SENTENCE_END_MARKS}
    if not ends:
        raise TwoTowerUserError(
            f"--block_format sentence_pairs cuts text after the tokens {list(SENTENCE_END_MARKS)}, and "
            f"{type(tokenizer).__name__} has none of them; use --block_format contiguous."
        )
    return {"ends": ends, "cls": tokenizer.cls_token_id, "sep": tokenizer.sep_token_id, "pad": tokenizer.pad_token_id}


def sentence_pair_blocks(token_ids: list[int], block_size: int, end_ids: set, cls_id: int, sep_id: int) -> list:
    """
    The real tokens of a stream's sentence-pair blocks, before padding, as the reference builds them (datautil.py
    WikiBookDatasetBert.__getitem__). A block per anchor 0, block_size, 2 * block_size, ... of the stream starts after
    the first sentence end at or past its anchor and holds as many whole sentences as fit beside [CLS] and two [SEP],
    split into two segments at the sentence end nearest their middle: [CLS] segment [SEP] segment [SEP]. With one
    whole sentence, [CLS] sentence [SEP]; with none (a sentence longer than the block), [CLS] and the next
    block_size - 1 tokens. A sentence ends at a token of `end_ids`. Blocks of neighbouring anchors may share text
    (as the reference's do); an anchor whose block would run past the end of the stream gives none.
    """
    ends = [position for position, token in enumerate(token_ids) if token in end_ids]
    blocks = []
    for anchor in range(0, len(token_ids), block_size):
        first_end = bisect_left(ends, anchor)
        if first_end == len(ends):
            break
        start = ends[first_end] + 1  # the first sentence starting after the anchor
        limit = start + block_size - 3  # a sentence ending before it fits beside [CLS] and two [SEP]
        overflow = bisect_left(ends, limit)  # the first sentence end that does not fit
        if overflow == len(ends):
            break
        fitting = ends[bisect_left(ends, start) : overflow]  # the ends of the whole sentences that fit
        if not fitting:  # a sentence longer than the block: its start, cut
            if start + block_size - 1 > len(token_ids):
                break
            blocks.append([cls_id, *token_ids[start : start + block_size - 1]])
        elif len(fitting) == 1:
            blocks.append([cls_id, *token_ids[start : fitting[0] + 1], sep_id])
        else:
            middle = start + (fitting[-1] - start) // 2
            split = min(fitting[:-1], key=lambda end: abs(end - middle))  # the first of ties, as the reference's argmin
            first, second = token_ids[start : split + 1], token_ids[split + 1 : fitting[-1] + 1]
            blocks.append([cls_id, *first, sep_id, *second, sep_id])
    return blocks


def tokenize_lines(examples, tokenizer, text_column_name, document_column):
    # No [CLS]/[SEP] around every line: the text is one running stream (sentence pairs add their own). Lines longer
    # than the model's positions are expected (blocks are cut afterwards): no warning about them.
    ids = tokenizer(examples[text_column_name], add_special_tokens=False, verbose=False)["input_ids"]
    if document_column is None:
        return {"input_ids": ids}
    return {"input_ids": ids, document_column: examples[document_column]}


def group_contiguous(examples, block_size, document_column):
    """The batch's lines as one stream cut into blocks, the remainder dropped; each block keeps the document of the
    line its first token comes from."""
    concatenated = list(chain.from_iterable(examples["input_ids"]))
    total_length = (len(concatenated) // block_size) * block_size
    blocks = {"input_ids": [concatenated[i : i + block_size] for i in range(0, total_length, block_size)]}
    if document_column is not None:
        line_ends = list(accumulate(len(ids) for ids in examples["input_ids"]))
        lines = [bisect_right(line_ends, start) for start in range(0, total_length, block_size)]
        blocks[document_column] = [examples[document_column][line] for line in lines]
    return blocks


def group_sentence_pairs(examples, block_size, special):
    """The batch's stream as sentence-pair blocks (sentence_pair_blocks), padded to block_size."""
    concatenated = list(chain.from_iterable(examples["input_ids"]))
    blocks = sentence_pair_blocks(concatenated, block_size, special["ends"], special["cls"], special["sep"])
    return {
        "input_ids": [block + [special["pad"]] * (block_size - len(block)) for block in blocks],
        "attention_mask": [[1] * len(block) + [0] * (block_size - len(block)) for block in blocks],
    }


def check_block_options(column_names, text_column_name, block_format, document_column):
    if document_column is not None and block_format != "contiguous":
        raise TwoTowerUserError(f"Blocks keep their document only in the contiguous format, not {block_format!r}.")
    if text_column_name not in column_names:
        raise ValueError(
            f"Column {text_column_name!r} not in the dataset (columns: {column_names}); set `text_column_name`."
        )
    if block_format not in BLOCK_FORMATS:
        raise TwoTowerUserError(f"`block_format` is {block_format!r}; choose one of {list(BLOCK_FORMATS)}.")


def tokenize_and_group(
    raw_datasets: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    text_column_name: str = "text",
    num_proc: int | None = None,
    overwrite_cache: bool = False,
    block_format: str = "contiguous",
    document_column: str | None = None,
) -> DatasetDict:
    """
    Tokenize every split, concatenate, and cut into blocks of `block_size` (each map batch's stream on its own):
    contiguous (the remainder dropped), or sentence pairs (`sentence_pair_blocks`) padded to block_size, with an
    attention_mask that is 0 on the padding. With `document_column` (a column of the raw lines, contiguous blocks
    only), each block keeps it: the value of the line its first token comes from.
    """
    column_names = raw_datasets["train"].column_names
    check_block_options(column_names, text_column_name, block_format, document_column)
    if block_format == "contiguous":
        group, options, kind = group_contiguous, {"document_column": document_column}, "blocks"
    else:  # the tokenizer's special tokens are checked before any tokenizing
        special = sentence_pair_tokens(tokenizer)
        group, options, kind = group_sentence_pairs, {"special": special}, "sentence-pair blocks"
    tokenized = raw_datasets.map(
        tokenize_lines,
        fn_kwargs={"tokenizer": tokenizer, "text_column_name": text_column_name, "document_column": document_column},
        batched=True,
        num_proc=num_proc,
        remove_columns=[name for name in column_names if name != document_column],
        load_from_cache_file=not overwrite_cache,
        desc="Tokenizing",
    )
    return tokenized.map(
        group,
        fn_kwargs={"block_size": block_size, **options},
        batched=True,
        num_proc=num_proc,
        load_from_cache_file=not overwrite_cache,
        desc=f"Grouping into {kind} of {block_size}",
    )


def split_blocks(
    lm_datasets: DatasetDict,
    block_size: int,
    validation_split_percentage: float,
    max_train_blocks: int | None = None,
    max_eval_blocks: int | None = None,
) -> DatasetDict:
    """Check there are blocks, hold out validation blocks when there is no validation split, apply the caps."""
    if len(lm_datasets["train"]) == 0:
        raise ValueError(
            f"The training text gives no block of block_size={block_size} tokens; give more text or a smaller "
            f"--block_size."
        )
    if "validation" not in lm_datasets:
        if validation_split_percentage <= 0:
            raise ValueError("No validation data: pass --validation_file or a --validation_split_percentage > 0.")
        held_out = lm_datasets["train"].train_test_split(
            test_size=validation_split_percentage / 100, seed=VALIDATION_SPLIT_SEED
        )
        lm_datasets = DatasetDict({"train": held_out["train"], "validation": held_out["test"]})
    if len(lm_datasets["validation"]) == 0:
        raise ValueError(f"The validation text gives no block of block_size={block_size} tokens; give more text.")
    caps = {"train": max_train_blocks, "validation": max_eval_blocks}
    return DatasetDict(
        {
            split: dataset.select(range(min(caps[split], len(dataset)))) if caps[split] else dataset
            for split, dataset in lm_datasets.items()
        }
    )


def collate_blocks(examples: list[dict]) -> dict:
    input_ids = torch.stack([example["input_ids"] for example in examples])  # [batch, block_size]
    if "attention_mask" not in examples[0]:
        return {"input_ids": input_ids, "labels": input_ids}  # the model shifts labels itself
    attention_mask = torch.stack([example["attention_mask"] for example in examples])  # [batch, block_size]
    # Padding is never a target (the reference's GPT and ELMo predicted it: ttlm/model.py, CAL_LOSS.CrossEntropyLoss).
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def make_dataloaders(
    lm_datasets: DatasetDict,
    train_batch_size: int,
    eval_batch_size: int,
    train_collator=collate_blocks,
    eval_collator=collate_blocks,
):
    """Shuffled train and ordered validation DataLoaders over the blocks (collators: e.g. masking for a masked LM)."""
    lm_datasets = lm_datasets.with_format("torch")
    # A private generator per loader: starting an epoch then draws no number from the global RNG, so a run
    # resumed mid-epoch sees the same dropout masks as one that never stopped.
    train_dataloader = DataLoader(
        lm_datasets["train"],
        shuffle=True,
        batch_size=train_batch_size,
        collate_fn=train_collator,
        generator=torch.Generator(),
    )
    eval_dataloader = DataLoader(
        lm_datasets["validation"], batch_size=eval_batch_size, collate_fn=eval_collator, generator=torch.Generator()
    )
    return train_dataloader, eval_dataloader
