"""The tokenizer of a run: loaded by name or path, or a byte-level BPE trained on the training text."""

import json
import math
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, BertTokenizer, GPT2Tokenizer, PreTrainedTokenizerFast
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from ..utils.errors import TwoTowerUserError

VOCAB_MULTIPLE = 64  # the model's vocabulary is padded up to a multiple of this, for matmul efficiency
END_OF_TEXT = "<|endoftext|>"  # the one special token of a trained BPE for a causal LM, as in GPT-2
PAD, MASK = "<pad>", "<mask>"  # added for a masked LM: the masking collator needs a mask token (RoBERTa's names)
SAVED_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
LOADING_FLAGS = ("is_local", "local_files_only")  # init kwargs of from_pretrained, not of the tokenizer


def _load_vocabulary_folder(folder: Path) -> PreTrainedTokenizerBase:
    # transformers 5's BertTokenizer(vocab_file=...) / GPT2Tokenizer(vocab_file=..., merges_file=...) silently
    # build an EMPTY vocabulary; from_pretrained(folder) reads the files, and the size check proves it did.
    if (folder / "vocab.txt").is_file():
        tokenizer = BertTokenizer.from_pretrained(folder)
        expected = len((folder / "vocab.txt").read_text(encoding="utf-8").splitlines())
    elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
        tokenizer = GPT2Tokenizer.from_pretrained(folder)
        expected = len(json.loads((folder / "vocab.json").read_text(encoding="utf-8")))
    else:
        raise FileNotFoundError(
            f"{folder} holds no tokenizer: expected tokenizer.json (a saved tokenizer), vocab.txt (BERT "
            f"WordPiece) or vocab.json + merges.txt (GPT-2 BPE)."
        )
    if len(tokenizer) < expected:
        raise ValueError(f"Loaded {len(tokenizer)} tokens from {folder}, but its vocabulary file has {expected}.")
    return tokenizer


def _without_loading_flags(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    # from_pretrained records how this machine loaded the files; saved, they would travel with the tokenizer
    for flag in LOADING_FLAGS:
        tokenizer.init_kwargs.pop(flag, None)
    return tokenizer


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """A tokenizer from a Hub name, a saved tokenizer folder, or a folder of BERT or GPT-2 vocabulary files."""
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        if any((folder / name).is_file() for name in SAVED_TOKENIZER_FILES):
            # a saved folder never runs code of its own, so transformers never asks whether to (a [y/N] prompt)
            return _without_loading_flags(AutoTokenizer.from_pretrained(folder, trust_remote_code=False))
        return _without_loading_flags(_load_vocabulary_folder(folder))
    if name_or_path.startswith((".", "/", "~")) or folder.exists():
        raise FileNotFoundError(f"Tokenizer folder {name_or_path!r} does not exist (or is not a folder).")
    try:
        return _without_loading_flags(AutoTokenizer.from_pretrained(name_or_path))
    except OSError as error:  # a relative folder that is not there reads as a Hub name
        reason = str(error).splitlines()[0]
        raise TwoTowerUserError(
            f"Tokenizer {name_or_path!r} is neither a local folder (there is no {folder.resolve()}) nor a tokenizer "
            f"reachable on the Hub ({reason}); pass an existing folder, or a Hub name with the Hub reachable."
        ) from error


def check_named_tokenizer(config) -> None:
    """The tokenizer --tokenizer_name_or_path names loads: checked before the data is read (a resumed run loads its
    checkpoint's)."""
    if config.tokenizer_name_or_path is not None and config.resume_from_checkpoint is None:
        load_tokenizer(config.tokenizer_name_or_path)


def train_bpe_tokenizer(
    text_batches: Iterator[list[str]], vocab_size: int, masked: bool = False
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (GPT-2 style: no unknown tokens, newlines kept); `masked` adds <pad> and <mask>."""
    special_tokens = [END_OF_TEXT, PAD, MASK] if masked else [END_OF_TEXT]
    min_size = len(pre_tokenizers.ByteLevel.alphabet()) + len(special_tokens)
    if vocab_size < min_size:
        raise ValueError(
            f"`tokenizer_vocab_size` must be >= {min_size} (256 bytes + {', '.join(special_tokens)}), got {vocab_size}."
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text_batches, trainer=trainer)
    masked_tokens = dict(pad_token=PAD, mask_token=MASK) if masked else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT, **masked_tokens
    )


def padded_vocab_size(tokenizer: PreTrainedTokenizerBase) -> int:
    """The model's vocab_size for this tokenizer: len(tokenizer) rounded up to a multiple of 64."""
    return math.ceil(len(tokenizer) / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def check_tokenizer_fits(tokenizer: PreTrainedTokenizerBase, model_vocab_size: int) -> None:
    if len(tokenizer) > model_vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocabulary has {model_vocab_size}: token ids "
            f"past {model_vocab_size - 1} have no embedding. Use the tokenizer the model was trained with."
        )


def build_tokenizer(config, raw_train_dataset, accelerator, resume_checkpoint: Path | None = None, masked=False):
    """
    The run's tokenizer: the checkpoint's when resuming, the pretrained model's in the probe phase (unless
    `tokenizer_name_or_path` says otherwise), the named one, or a BPE trained on the training text (with a mask
    token when `masked`). Training happens on the main process, which saves it to OUTPUT_DIR/tokenizer for the
    other processes to load.
    """
    if resume_checkpoint is not None:
        return load_tokenizer(str(resume_checkpoint))
    if config.tokenizer_name_or_path is not None:
        return load_tokenizer(config.tokenizer_name_or_path)
    if config.phase == "probe":
        return load_tokenizer(config.pretrained_model)
    folder = Path(config.output_dir) / "tokenizer"
    with accelerator.main_process_first():
        if accelerator.is_main_process:
            batches = (batch[config.text_column_name] for batch in raw_train_dataset.iter(batch_size=1000))
            tokenizer = train_bpe_tokenizer(batches, config.tokenizer_vocab_size, masked)
            tokenizer.save_pretrained(folder)
        else:
            tokenizer = load_tokenizer(str(folder))
    return tokenizer
