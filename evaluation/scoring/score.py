"""
Score a two-tower model that has trained probes: each probe's log-probability of every gold token of a dataset,
the joint model's and each probe's perplexity, the tower preference statistics, and a report folder
(preference.json, preference_per_token.csv, PNG plots, report.md, and tokens.html, the token view of the first
blocks; see twotower.evaluation.scoring.report).

The data options are the training command's: the same flags select the same held-out blocks (the validation
split, or the blocks held out of the training text with a fixed seed). A local --validation_file alone is
enough to score that text.

One CPU, a model trained with the tiny recipes:
    python -m twotower.evaluation.scoring.score --model_dir outputs/tiny/probe/model --output_dir outputs/tiny/report \
        --validation_file ../shared/data/wikitext-2/valid.txt

A masked LM (BERT-style) is scored in deterministic masking passes that mask every token exactly once
(--mask_passes, 7 by default: pass k masks the positions p with p % 7 == k); an ELMo-style LSTM model never
reads the token it predicts, so it is scored in one unmasked pass. preference.json and report.md say which.

One GPU, a base model on WikiText-103's validation split from the Hub, in bfloat16:
    python -m twotower.evaluation.scoring.score --model_dir outputs/base/probe/model --output_dir outputs/base/report \
        --dataset_name wikitext --dataset_config_name wikitext-103-raw-v1 --dtype bfloat16 --batch_size 128
"""

import dataclasses
import re
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from datasets import DatasetDict
from modeling_twotower.towers import tower_stack_class
from torch.utils.data import DataLoader

from twotower.training.arguments import DataArguments
from twotower.training.utils.cli import run
from twotower.training.utils.options import Bounds, OptionsParser, at_least, check_options, option
from twotower.training.data.blocks import (
    BLOCK_FORMATS,
    collate_blocks,
    load_raw_datasets,
    resolve_text_files,
    split_blocks,
    tokenize_and_group,
    tokenize_lines,
)
from twotower.training.utils.errors import TwoTowerUserError
from twotower.training.loading import load_two_tower, read_training_config
from twotower.training.data.objectives import needs_masking, objective_of
from twotower.training.data.tokenizer import check_tokenizer_fits, load_tokenizer
from twotower.training.phases.validation import perplexity

from .ablation import ablation_summary
from .cross_fitting import WIKITEXT_ARTICLE_HEADING, CrossFittedPreference, number_documents
from .parts_of_speech_report import parts_of_speech_section, scored_text_lines
from .report import NEGATIVE_RELIABILITY_NOTE, per_token_table, write_report
from .engine import DEFAULT_MASK_PASSES, ScoredPassages, score_blocks
from .report_lock import report_folder_locked
from .token_categories import WordStarts, categorize, detect_scheme
from ..tower_preference.measures import PROBE_FREE_MEASURES
from ..tower_preference.text_cells import is_byte_level, with_cells
from ..tower_preference.token_view import render_token_view


SPLITS = ("validation", "train")
DOCUMENT_COLUMN = "document"  # of each block: its first token's document (cross_fitting.number_documents)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# the ScoringArguments fields recorded in preference.json under "data" and "settings"
DATA_FIELDS = (
    "dataset_name",
    "dataset_config_name",
    "text_column_name",
    "train_file",
    "validation_file",
    "validation_split_percentage",
    "split",
    "block_size",
    "max_blocks",
    "spread_blocks",
)
SETTINGS_FIELDS = (
    "batch_size", "probe_chunk_size", "dtype", "torch_compile", "alpha", "min_count", "top_k", "center",
    "pair_replicas", *(measure.option for measure in PROBE_FREE_MEASURES), "document_pattern", "parts_of_speech",
)
# keyword-only: the required I/O fields follow DataArguments' fields, which have defaults
@dataclass(kw_only=True)
class ScoringArguments(DataArguments):
    # I/O
    model_dir: str = option(help="folder of a two-tower model with trained probes (a probe run's OUTPUT_DIR/model)")
    output_dir: str = option(help="the report folder to write")

    # data: DataArguments' fields (the training command's, so the same flags select the same blocks); here the block
    # format defaults to the model's, and the fields below choose which blocks to score
    block_format: str | None = option(
        None, "contiguous | sentence_pairs; None: the model's (its training_config.yaml)",
        choices=(None, *BLOCK_FORMATS),
    )
    split: str = option("validation", "validation | train: which blocks to score", choices=SPLITS)
    max_blocks: int | None = option(
        None, "score only the first N blocks of the split; None = all",
        bounds=at_least(1), unset="score every block",
    )
    spread_blocks: bool = option(
        False, "with max_blocks: N blocks evenly spaced over the split instead of the first N (the first N of a "
        "folder of texts would all come from its first file)",
    )

    # masked LMs (transformer towers)
    mask_passes: int = option(
        DEFAULT_MASK_PASSES, "pass k masks positions p with p % mask_passes == k: each token once",
        bounds=at_least(1),
    )

    # compute
    batch_size: int = option(32, "sequences per forward pass", bounds=at_least(1))
    probe_chunk_size: int | None = option(
        None, "positions per chunk of the probes' vocabulary projection; None = auto",
        bounds=at_least(1), unset="let the probes choose",
    )
    dtype: str = option(
        "float32", "float32 | bfloat16 | float16: the model's weights (log-probs are float32 either way)",
        choices=tuple(DTYPES),
    )
    cpu: bool = option(False, "score on CPU even when a GPU is present")
    torch_compile: bool = option(
        False, "compile the towers, the joint head and the probes (torch.compile; the first batches of each shape "
        "wait for the compiler): on a 2-core CPU the tiny model scored 1.8-2.1x the tokens/s (docs/speed.md)",
    )
    disable_tqdm: bool = option(False, "hide the progress bar")

    # statistics
    alpha: float = option(
        0.05, "false discovery rate of Benjamini-Hochberg",
        bounds=Bounds(0, 1, low_open=True, high_open=True, note="a false discovery rate, e.g. 0.05"),
    )
    min_count: int = option(
        10, "token types seen fewer times are excluded from shares, significance and consistency",
        bounds=at_least(2, "a standard error needs 2 occurrences"),
    )
    top_k: int = option(20, "top tokens listed per tower", bounds=at_least(0))
    token_view_blocks: int = option(
        8, "blocks shown in tokens.html, each token coloured by its type's preference (recorded during the one "
        "scoring pass, so the page stays small whatever the data); 0 writes no token view",
        bounds=at_least(0, "0 writes no token view"),
    )
    center: bool = option(
        False, "subtract the global offset (one tower better overall) before testing each type; see "
        "global_offset_nats in the summary and the tower_preference metric card",
    )
    pair_replicas: bool = option(
        True, "probe replicas: replica r of every tower was trained on the same data order (the probe phase does "
        "this), so the test pairs them; False compares independent replica means",
    )
    ablation: bool = option(
        True, "the mean-ablation preference beside the probes' (scoring/ablation.py): one more pass of the "
        "towers and one of the joint head per tower",
    )
    resample_ablation: bool = option(
        True, "the resample-ablation preference (tower_preference/resample_ablation.py): each tower's state replaced "
        "by its state on another block of the batch; one more pass of the joint head per tower",
    )
    document_pattern: str | None = option(
        WIKITEXT_ARTICLE_HEADING,
        "cross-fitting: a line matching it starts a new document, as does every file of the text; alternate "
        "documents form the two halves (scoring/cross_fitting.py)",
    )
    parts_of_speech: bool = option(
        True, "tag the scored text (spaCy: `pip install \"twotower[pos]\"`) for the preference per part of speech "
        "and the function/content contrast (scoring/parts_of_speech_report.py); without spaCy, report.md says how "
        "to get them",
    )

    def __post_init__(self):
        """Every option checked now, before the model runs over the data."""
        check_options(self)
        if self.document_pattern is not None:
            try:
                re.compile(self.document_pattern)
            except re.error as error:
                raise TwoTowerUserError(
                    f"`document_pattern` {self.document_pattern!r} is not a regular expression ({error}); pass one "
                    "that matches the line starting a document, e.g. WikiText's article heading '^ = [^=].* = $'."
                ) from error


def check_output_dir(output_dir, model_dir):
    """The report folder can be written: checked before the model runs over the data, not after."""
    output, model = Path(output_dir).resolve(), Path(model_dir).resolve()
    if output == model:
        raise TwoTowerUserError(
            f"--output_dir {str(output_dir)!r} is the model folder; write the report elsewhere (e.g. "
            f"{model.parent / 'report'})."
        )
    existing = output
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise TwoTowerUserError(f"--output_dir {str(output_dir)!r} cannot be created: {existing} is a file.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise TwoTowerUserError(
            f"--output_dir {str(output_dir)!r} cannot be written ({existing}: {error.strerror}); pass a folder you "
            "can write to."
        ) from error


def load_blocks(args, tokenizer):
    """
    (blocks, text_tokens): the blocks of `args.split`, built exactly as the training command builds them, capped by
    max_blocks; and how many tokens the scored text has and how many of them no block holds (`tokens_in_no_block`),
    or None where the blocks are a sample of a text (held out of a training text) or sentence pairs.
    """
    if args.split == "validation" and args.validation_file is not None:
        blocks, text_tokens = _validation_file_blocks(args, tokenizer)
    else:
        raw_datasets = load_raw_datasets(
            args.dataset_name, args.dataset_config_name, args.train_file, args.validation_file
        )
        files = {"train": args.train_file, "validation": args.validation_file}
        raw_datasets = with_documents(raw_datasets, files, args)
        lm_datasets = _tokenized_blocks(raw_datasets, args, tokenizer)
        blocks = split_blocks(lm_datasets, args.block_size, args.validation_split_percentage)[args.split]
        # without a validation split, split_blocks holds blocks out of the training text: each split is a sample
        whole_text = "validation" in raw_datasets
        text_tokens = tokens_in_no_block(raw_datasets[args.split], len(blocks), args, tokenizer) if whole_text else None
    if args.max_blocks is None or len(blocks) <= args.max_blocks:
        return blocks, text_tokens
    if args.spread_blocks:
        return blocks.select(np.linspace(0, len(blocks) - 1, args.max_blocks).round().astype(int).tolist()), text_tokens
    return blocks.select(range(args.max_blocks)), text_tokens


def _tokenized_blocks(raw_datasets, args, tokenizer):
    return tokenize_and_group(
        raw_datasets,
        tokenizer,
        args.block_size,
        args.text_column_name,
        args.preprocessing_num_workers,
        args.overwrite_cache,
        block_format(args),
        DOCUMENT_COLUMN if DOCUMENT_COLUMN in raw_datasets["train"].column_names else None,
    )


def block_format(args) -> str:
    return args.block_format or trained_block_format(args.model_dir)


def with_documents(raw_datasets, files: dict, args):
    """
    Each split's lines numbered by document (cross_fitting.number_documents over the split's files), for
    contiguous blocks; sentence-pair blocks are cut at sentence ends and keep no document.
    """
    if block_format(args) != "contiguous":
        return raw_datasets
    numbered = {}
    for split, lines in raw_datasets.items():
        paths = resolve_text_files(files[split]) if files.get(split) else []
        counts = [load_raw_datasets(None, train_file=path)["train"].num_rows for path in paths] if len(paths) > 1 else [
            lines.num_rows]
        documents = number_documents(lines[args.text_column_name], counts, args.document_pattern)
        numbered[split] = lines.add_column(DOCUMENT_COLUMN, documents.tolist())
    return DatasetDict(numbered)


def trained_block_format(model_dir) -> str:
    """The block format of the runs that trained the model (its training_config.yaml); contiguous if it names none."""
    return (read_training_config(model_dir) or {}).get("block_format", "contiguous")


def _validation_file_blocks(args, tokenizer):
    """The blocks of a local validation text and its tokens_in_no_block: they depend on that text alone, so the
    training text is not read."""
    # load_raw_datasets names the split of a lone local text "train"
    raw_datasets = load_raw_datasets(args.dataset_name, args.dataset_config_name, train_file=args.validation_file)
    raw_datasets = with_documents(raw_datasets, {"train": args.validation_file}, args)
    blocks = _tokenized_blocks(raw_datasets, args, tokenizer)["train"]
    if len(blocks) == 0:
        raise TwoTowerUserError(
            f"--validation_file {args.validation_file!r} gives no block of block_size={args.block_size} tokens; "
            "give more text or a smaller --block_size."
        )
    return blocks, tokens_in_no_block(raw_datasets["train"], len(blocks), args, tokenizer)


def tokens_in_no_block(lines, num_blocks, args, tokenizer) -> dict | None:
    """
    {"num_text_tokens", "num_tokens_in_no_block"} of a text's `lines` cut into `num_blocks` contiguous blocks: the
    training command's blocks leave out the tokens after the last whole block of each batch of 1,000 lines (datasets'
    map batches, grouped one at a time), so a short text loses its last partial block. None for sentence-pair blocks,
    which start at sentence ends and may share text.
    """
    if block_format(args) != "contiguous":
        return None
    counts = lines.map(
        _line_token_counts,
        fn_kwargs={"tokenizer": tokenizer, "text_column_name": args.text_column_name},
        batched=True,
        num_proc=args.preprocessing_num_workers,
        remove_columns=lines.column_names,
        load_from_cache_file=not args.overwrite_cache,
        desc="Counting the text's tokens",
    )
    num_text_tokens = int(sum(counts["num_tokens"]))
    in_no_block = num_text_tokens - num_blocks * args.block_size
    return {"num_text_tokens": num_text_tokens, "num_tokens_in_no_block": in_no_block}


def _line_token_counts(examples, tokenizer, text_column_name):
    ids = tokenize_lines(examples, tokenizer, text_column_name, document_column=None)["input_ids"]
    return {"num_tokens": [len(line) for line in ids]}


def collate_scored_blocks(examples, unscored_ids=()):
    """collate_blocks, whose labels (-100 on padding) also skip `unscored_ids`: [CLS] and [SEP] for a masked LM;
    blocks numbered by document keep their numbers ([batch])."""
    batch = collate_blocks(examples)
    if DOCUMENT_COLUMN in examples[0]:
        batch[DOCUMENT_COLUMN] = torch.stack([example[DOCUMENT_COLUMN] for example in examples])
    if "attention_mask" in batch and unscored_ids:
        batch["labels"] = batch["labels"].masked_fill(torch.isin(batch["input_ids"], torch.tensor(unscored_ids)), -100)
    return batch


def masking_description(objective, towers, mask_passes):
    """How the scored predictions were made, in words (preference.json settings and report.md)."""
    if objective == "causal":
        return "none: next-token prediction, every token after the first of each block scored once"
    if not towers.sees_predicted_token:
        return "none: ELMo-style towers never read the token they predict; every token scored once, unmasked"
    return (
        f"{mask_passes} deterministic passes, each token masked once (pass k replaces the positions p with "
        f"p % {mask_passes} == k by the mask token)"
    )


def probe_perplexities(probe_mean_nll, num_towers):
    """{"probes": [per tower, from its replicas' mean NLL]} plus "probe_replicas" ([per replica] per tower) if any."""
    per_tower = np.asarray(probe_mean_nll).reshape(num_towers, -1)
    perplexities = {"probes": [perplexity(nll) for nll in per_tower.mean(axis=1)]}
    if per_tower.shape[1] > 1:
        perplexities["probe_replicas"] = [[perplexity(nll) for nll in replicas] for replicas in per_tower]
    return perplexities


def _data_description(args):
    """Which text was scored, in words (for report.md)."""
    if args.split == "validation" and args.validation_file is not None:
        return f"local text {args.validation_file}"
    if args.train_file is not None:
        if args.split == "train":
            return f"local text {args.train_file}"
        return f"the {args.validation_split_percentage:g}% of blocks held out of local text {args.train_file}"
    config_name = f" ({args.dataset_config_name})" if args.dataset_config_name else ""
    return f"{args.split} split of {args.dataset_name}{config_name}"


def _tokenizer_that_fits(args, model_config):
    """The model folder's tokenizer, checked against the model: its vocabulary, its mask token, its positions."""
    tokenizer = load_tokenizer(args.model_dir)
    check_tokenizer_fits(tokenizer, model_config.vocab_size)
    if needs_masking(objective_of(model_config), tower_stack_class(model_config)) and tokenizer.mask_token_id is None:
        raise TwoTowerUserError(
            f"{args.model_dir} holds a masked LM but its tokenizer has no mask token to score it with; save the "
            "tokenizer the model was trained with (the training command does)."
        )
    if args.block_size > model_config.max_position_embeddings:
        raise TwoTowerUserError(
            f"--block_size {args.block_size} exceeds the model's max_position_embeddings "
            f"({model_config.max_position_embeddings}); lower --block_size."
        )
    return tokenizer


def _model_description(model_dir, model) -> dict:
    """The scored model, as preference.json records it under "model"."""
    config = model.config
    return {
        "path": str(Path(model_dir).resolve()),
        "model_type": config.model_type,
        "architecture": type(model).__name__,
        "tower_type": config.tower_type,
        "cooperative": config.cooperative,
        "num_towers": config.num_towers,
        "probe_replicas": config.probe_replicas,
        "probe_type": config.probe_type,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "vocab_size": config.vocab_size,
        "num_parameters": model.num_parameters(),
    }


@report_folder_locked  # one report at a time in a folder, as one run at a time in a run folder
def score_model(model_dir, output_dir, **options):
    """
    Score `model_dir` and write the report folder `output_dir`; `options` are ScoringArguments' other fields.

    Returns the report: {"model", "data", "settings", "perplexity": {"joint", "probes"}, "summary"}, as written
    to output_dir/preference.json.
    """
    args = ScoringArguments(model_dir=str(model_dir), output_dir=str(output_dir), **options)
    check_output_dir(args.output_dir, args.model_dir)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    model = load_two_tower(args.model_dir, DTYPES[args.dtype]).to(device)
    if args.torch_compile:
        compile_for_scoring(model)
    objective, towers = objective_of(model), model.model.towers
    tokenizer = _tokenizer_that_fits(args, model.config)

    blocks, text_tokens = load_blocks(args, tokenizer)
    # a masked LM never predicts the [CLS] and [SEP] of sentence-pair blocks (nor, as any model, their padding)
    unscored_ids = [tokenizer.cls_token_id, tokenizer.sep_token_id] if needs_masking(objective, towers) else []
    collate = partial(collate_scored_blocks, unscored_ids=[token for token in unscored_ids if token is not None])
    dataloader = DataLoader(blocks.with_format("torch"), batch_size=args.batch_size, collate_fn=collate)
    passages = ScoredPassages(args.token_view_blocks)
    consumers = [passages]
    word_starts = word_starts_of(tokenizer)
    if word_starts is not None:
        consumers.append(word_starts)
    measures, measures_left_out = measures_for(args, len(blocks))
    cross_fit = None
    if model.config.probe_replicas >= 2 and DOCUMENT_COLUMN in blocks.column_names:
        cross_fit = CrossFittedPreference(model.config.num_towers, model.config.probe_replicas, model.config.vocab_size)
        consumers.append(cross_fit)
    scores = score_blocks(
        model,
        dataloader,
        probe_chunk_size=args.probe_chunk_size,
        mask_passes=args.mask_passes,
        mask_token_id=tokenizer.mask_token_id,
        pair_replicas=args.pair_replicas,
        disable_tqdm=args.disable_tqdm,
        consumers=consumers,
        measures=[measure.name for measure in measures],
    )
    (accumulator,) = scores.accumulators
    result = accumulator.compute(alpha=args.alpha, min_count=args.min_count, top_k=args.top_k, center=args.center)

    report = {
        "model": _model_description(args.model_dir, model),
        "data": {
            "description": _data_description(args),
            **{field: getattr(args, field) for field in DATA_FIELDS},
            "num_blocks": len(blocks),
            "measures_left_out": measures_left_out,
            "num_predictions": accumulator.num_predictions,
            **(text_tokens or {}),
        },
        "settings": {field: getattr(args, field) for field in SETTINGS_FIELDS}
        | {"objective": objective, "masking": masking_description(objective, towers, args.mask_passes)}
        | {"device": device.type},
        "perplexity": {"joint": perplexity(scores.joint_mean_nll)}
        | probe_perplexities(scores.probe_mean_nll(), model.config.num_towers),
    }
    measured = probe_free_results(args, report, result, scores)
    if cross_fit is not None:
        replica_data = (read_training_config(args.model_dir) or {}).get("probe_replica_data", "shared")
        report["cross_fit"] = cross_fit.compute(args.min_count) | {"probe_replica_data": replica_data}
    if args.parts_of_speech:
        report["parts_of_speech"] = parts_of_speech_section(lambda: scored_text_lines(args), tokenizer, result)
    tokens = tokenizer.convert_ids_to_tokens(result.token_ids.tolist())
    token_view = None
    if args.token_view_blocks:
        source = f"The first {len(passages.input_ids)} of {len(blocks)} blocks of {report['data']['description']}."
        token_view = token_view_page(result, tokens, passages, tokenizer, source, measured, word_starts)
    type_sums = None if cross_fit is None else cross_fit.type_sums()
    write_report(args.output_dir, report, result, tokens, token_view, measured, type_sums)
    return {**report, "summary": result.summary}


def compile_for_scoring(model) -> None:
    """Compile, in place, the parts a scoring pass runs: the towers (`model.model`), the joint head and the probes."""
    for part in (model.model, model.lm_head, model.probes):
        part.compile()


def measures_for(args, num_blocks: int):
    """The probe-free measures turned on that this text and batch size allow, and {label: why} of those they don't
    (a text or a batch shorter than a measure's `min_blocks`: the report says so rather than the scoring failing)."""
    turned_on = [measure for measure in PROBE_FREE_MEASURES if getattr(args, measure.option)]
    fewest = min(num_blocks, args.batch_size)
    left_out = {measure.label: f"it needs batches of at least {measure.min_blocks} blocks, and this text was scored "
                f"as {num_blocks} in batches of up to {args.batch_size}"
                for measure in turned_on if fewest < measure.min_blocks}
    return [measure for measure in turned_on if fewest >= measure.min_blocks], left_out


def probe_free_results(args, report, result, scores) -> dict:
    """Into `report`, under each measure's name: the summary of every probe-free measure that was measured (its
    agreement with the probes' preference `result` and with the others'); returns {name: PreferenceResult} for the
    per-token table and the token view."""
    measured = {name: consumer.accumulator.compute(alpha=args.alpha, min_count=args.min_count, top_k=args.top_k)
                for name, consumer in scores.measures.items()}
    for name, consumer in scores.measures.items():
        others = {other: measured[other] for other in measured if other != name}
        report[name] = ablation_summary(measured[name], result, consumer.mean_increase_nats(), others)
    return measured


def token_view_page(result, tokens, passages, tokenizer, source, measured=None, word_starts=None):
    """tokens.html: the recorded passages (ScoredPassages, padding dropped), filtered by the package's categories,
    with each probe-free measure's preference ({name: PreferenceResult}) on the hover card when given."""
    shown = []
    for input_ids, kept, gold_logprobs in zip(passages.input_ids, passages.attention_mask, passages.gold_logprobs):
        shown.append({"token_ids": input_ids[kept].tolist(), "gold_logprobs": gold_logprobs[:, kept]})
    categories = token_view_categories(result, tokens, tokenizer, word_starts)
    measures = {name: measure_result.to_dict() for name, measure_result in (measured or {}).items()}
    return render_token_view(result.to_dict(), tokens, with_cells(tokenizer, shown), categories, source=source,
                             measures=measures, byte_level=is_byte_level(tokenizer))


def token_view_categories(result, tokens, tokenizer, word_starts=None) -> dict:
    """The token categories of every scored type (twotower.evaluation.scoring.token_categories), or none for a tokenizer
    that is neither byte-level BPE nor WordPiece, whose pieces they cannot label; `word_starts` (a WordStarts fed by
    the scoring pass) makes a piece that mostly follows whitespace in the text word-initial."""
    try:
        scheme = detect_scheme(tokenizer.get_vocab())
    except ValueError:
        return {}
    follows_whitespace = set() if word_starts is None else word_starts.types()
    return categorize(per_token_table(result, tokens), scheme, tokenizer.all_special_tokens, follows_whitespace)


def word_starts_of(tokenizer) -> WordStarts | None:
    """The WordStarts that counts which types follow whitespace in the scored blocks; None for a tokenizer that is
    neither byte-level BPE nor WordPiece (token_view_categories labels none of its pieces)."""
    try:
        scheme = detect_scheme(tokenizer.get_vocab())
    except ValueError:
        return None
    return WordStarts(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))), scheme)


def summary_line(report, centered=False):
    """What a scoring run found, in one line: with probe replicas, led by the replica-level figures."""
    summary = report["summary"]
    line = (
        f"joint perplexity {report['perplexity']['joint']:.2f}, probe perplexities "
        f"{', '.join(f'{value:.2f}' for value in report['perplexity']['probes'])}; global offset "
        f"{', '.join(f'{value:+.3f}' for value in summary['global_offset_nats'])} nats; "
    )
    if summary.get("test") == "replica":
        low, high = summary["reliability_ci"]
        return line + (
            f"reliability {_number(summary['reliability'])} (95% CI {_number(low)} to {_number(high)}"
            f"{'; ' + NEGATIVE_RELIABILITY_NOTE if (summary['reliability'] or 0.0) < 0 else ''}); "
            f"{summary['num_significant']} of {summary['num_eligible_types']} eligible token types prefer one tower "
            f"beyond probe noise{' once centered on it' if centered else ''}; two-tower difference "
            f"{_number(summary['two_tower_difference_nats'])} nats against a same-tower floor of "
            f"{_number(summary['same_tower_floor_nats'])} nats."
        )
    return line + (
        f"{summary['num_significant']} of {summary['num_eligible_types']} eligible token types prefer one tower "
        f"significantly over occurrences{' once centered on it' if centered else ''} (one probe per tower: "
        f"probe noise is not accounted for); split-half consistency {_number(summary['split_half_consistency'])}."
    )


def _number(value):
    return "n/a" if value is None else f"{value:.3f}"


def main(argv=None):
    (args,) = OptionsParser(ScoringArguments).parse(argv)
    report = score_model(**dataclasses.asdict(args))
    print(f"Wrote {args.output_dir}: {summary_line(report, args.center)}")
    return report


if __name__ == "__main__":
    run(main)
