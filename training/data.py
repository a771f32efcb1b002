"""Raw text -> blocks of `block_size` token ids, through `datasets` (batched, multi-process, cached)."""

import glob
from itertools import chain
from pathlib import Path

import torch
from datasets import DatasetDict, load_dataset
from torch.utils.data import DataLoader
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

# The held-out blocks must not change with the training seed, so runs with different seeds share a validation set.
VALIDATION_SPLIT_SEED = 0


def resolve_text_files(spec: str) -> list[str]:
    """A .txt file, a folder (its *.txt files) or a glob -> sorted list of non-empty files."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.txt"))
    elif glob.has_magic(spec):
        files = sorted(Path(match) for match in glob.glob(str(path)))
    elif path.is_file():
        files = [path]
    else:
        raise FileNotFoundError(
            f"Data file {spec!r} does not exist; pass a .txt file, a folder of .txt files or a glob."
        )
    if not files:
        raise FileNotFoundError(f"No .txt files found for {spec!r}.")
    empty = [str(file) for file in files if file.stat().st_size == 0]
    if empty:
        raise ValueError(f"Empty data file(s): {empty}; remove them or point to files with text.")
    return [str(file) for file in files]


def load_raw_datasets(
    dataset_name: str,
    dataset_config_name: str | None = None,
    train_file: str | None = None,
    validation_file: str | None = None,
) -> DatasetDict:
    """Line-per-example raw text: local files when `train_file` is set, else a Hub dataset; splits train/validation."""
    if validation_file is not None and train_file is None:
        raise ValueError("`validation_file` is set but `train_file` is not; pass both (or neither, for a Hub dataset).")
    if train_file is not None:
        data_files = {"train": resolve_text_files(train_file)}
        if validation_file is not None:
            data_files["validation"] = resolve_text_files(validation_file)
        # Line breaks are kept so that byte-level tokenizers can learn and predict them.
        return load_dataset("text", data_files=data_files, keep_linebreaks=True)
    raw_datasets = load_dataset(dataset_name, dataset_config_name)
    return DatasetDict({split: raw_datasets[split] for split in ("train", "validation") if split in raw_datasets})


def tokenize_and_group(
    raw_datasets: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    text_column_name: str = "text",
    num_proc: int | None = None,
    overwrite_cache: bool = False,
) -> DatasetDict:
    """Tokenize every split, concatenate, cut into blocks of `block_size` (each map batch's remainder is dropped)."""
    column_names = raw_datasets["train"].column_names
    if text_column_name not in column_names:
        raise ValueError(
            f"Column {text_column_name!r} not in the dataset (columns: {column_names}); set `text_column_name`."
        )

    def tokenize(examples):
        # No [CLS]/[SEP] around every line: the text is one running stream, as the causal LM reads it.
        return {"input_ids": tokenizer(examples[text_column_name], add_special_tokens=False)["input_ids"]}

    def group_texts(examples):
        concatenated = list(chain.from_iterable(examples["input_ids"]))
        total_length = (len(concatenated) // block_size) * block_size
        return {"input_ids": [concatenated[i : i + block_size] for i in range(0, total_length, block_size)]}

    tokenized = raw_datasets.map(
        tokenize,
        batched=True,
        num_proc=num_proc,
        remove_columns=column_names,
        load_from_cache_file=not overwrite_cache,
        desc="Tokenizing",
    )
    return tokenized.map(
        group_texts,
        batched=True,
        num_proc=num_proc,
        load_from_cache_file=not overwrite_cache,
        desc=f"Grouping into blocks of {block_size}",
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
    return {"input_ids": input_ids, "labels": input_ids}  # the model shifts labels itself


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
