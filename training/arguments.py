"""Every knob of a training run in one dataclass, and how recipes and the command line fill it in."""

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from accelerate.utils import LoggerType

from modeling_twotower.configuration_twotower import (
    INITIALIZATIONS,
    LAYOUTS,
    PRESETS,
    PROBE_TYPES,
    TOWER_TYPES,
    TwoTowerConfig,
)

from .hub import check_repo_id
from .utils.atomic import write_text_atomically
from .data.blocks import BLOCK_FORMATS
from .utils.errors import TwoTowerUserError
from .utils.options import Bounds, OptionsParser, above, at_least, check_ranges, check_types_and_choices, closest_name
from .utils.options import convert_values, option
from .utils.recipe_files import RECIPE_SUFFIXES, read_recipe_file
from .data.objectives import OBJECTIVES

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
PHASES = ("pretrain", "probe")
MIXED_PRECISIONS = ("no", "fp16", "bf16")
PROBE_FEATURE_CACHES = ("memory", "disk", "auto", "none")
# the parameters AdamW does not decay: ours; the reference BERT's (its DeepSpeed layers' LayerNorms and every bias,
# ttlm/model.py prepare_optimizer_parameters); the reference GPT's and ELMo's (none: they have no such method)
WEIGHT_DECAY_EXCLUSIONS = ("norms_and_biases", "tower_norms_and_biases", "none")
PROBE_GRAD_CLIPPINGS = ("joint", "per_probe")
PROBE_REPLICA_DATA = ("shared", "disjoint")
RESOLVED_CONFIG_NAME = "training_config.yaml"
RUN_RECORDS = ("optimizer", "precision", "probe_runs")  # what a run writes about itself into its resolved config: never options
# the transformers schedules that need nothing but the step counts (the others need a metric or extra arguments)
LR_SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                 "inverse_sqrt")
TRACKERS = (*(tracker.value for tracker in LoggerType), "none")
MAX_SEED = 2**32 - 1  # numpy's seed range, which set_seed also seeds
BYTE_LEVEL_ALPHABET = 256  # a trained BPE holds every byte, plus its special tokens
@dataclass
class DataArguments:
    """The data options of training and scoring: the same flags select the same blocks in both commands."""

    dataset_name: str = option("wikitext", "Hub dataset, used when train_file is not set")
    dataset_config_name: str | None = option("wikitext-2-raw-v1", "configuration of the Hub dataset")
    text_column_name: str = option("text", "column of the Hub dataset holding raw text")
    train_file: str | None = option(
        None, "local text: a .txt file, a folder of .txt files or a glob; replaces dataset_name",
    )
    validation_file: str | None = option(
        None, "same forms; without it (or a validation split) blocks of the training text are held out; scoring a "
        "validation_file alone scores that text",
    )
    validation_split_percentage: float = option(
        5.0, "% of train blocks held out, chosen with a fixed seed",
        bounds=Bounds(0, 100, high_open=True),
    )
    block_size: int = option(
        128, "tokens per sequence (the paper's context length); at most max_position_embeddings",
        bounds=at_least(2, "a block of one token has no target: nothing to train on or score"),
    )
    block_format: str = option(
        "contiguous",
        "contiguous: the running token stream cut every block_size tokens | sentence_pairs: the reference "
        "code's blocks, [CLS] sentences [SEP] sentences [SEP] [PAD]... (whole sentences from an anchor every "
        "block_size tokens; needs [CLS], [SEP] and [PAD], e.g. the bert-base-uncased WordPiece)",
        choices=BLOCK_FORMATS,
    )
    preprocessing_num_workers: int | None = option(
        None, "processes for datasets.map; None = one",
        bounds=at_least(1), unset="tokenize in one process",
    )
    overwrite_cache: bool = option(False, "re-tokenize instead of reusing the datasets cache")

    def check_block_size(self, model_config, other_fix: str = "") -> None:
        """Refuse a --block_size beyond the positions of `model_config` (`other_fix`: a fix besides lowering it)."""
        if self.block_size > model_config.max_position_embeddings:
            raise TwoTowerUserError(
                f"--block_size {self.block_size} exceeds the model's max_position_embeddings "
                f"({model_config.max_position_embeddings}); lower --block_size{other_fix}."
            )


@dataclass
class TwoTowerTrainingConfig(DataArguments):
    # data: DataArguments' fields (first in a saved training_config.yaml, which every reader loads as a dict)

    # recipe
    recipe: str | None = option(None, "a recipe name in training/recipes (tiny, base_probe, ...) or a YAML path")

    # data (training only)
    max_train_blocks: int | None = option(
        None, "use only the first N training blocks (quick runs); None = all",
        bounds=at_least(1), unset="use every training block",
    )
    max_eval_blocks: int | None = option(
        None, "use only the first N validation blocks; None = all",
        bounds=at_least(1), unset="use every validation block",
    )

    # tokenizer
    tokenizer_name_or_path: str | None = option(
        None, "Hub name, saved tokenizer, or a folder with bert vocab.txt or gpt2 vocab.json + merges.txt; None = "
        "train a byte-level BPE on the training text (pretrain) or use the tokenizer saved with "
        "pretrained_model (probe)",
    )
    tokenizer_vocab_size: int = option(8192, "vocabulary of a newly trained BPE tokenizer")

    # objective: None = causal when pretraining, the pretrained model's in the probe phase
    objective: str | None = option(
        None, "causal (next token, TwoTowerForCausalLM) | masked (TwoTowerForMaskedLM)",
        choices=(None, *OBJECTIVES),
    )
    mlm_probability: float = option(
        0.15, "masked transformer towers: share of tokens selected (80/10/10 replaced)",
        bounds=Bounds(0, 1, low_open=True, high_open=True),
    )

    # model (pretrain phase): a preset plus optional overrides; None keeps the preset's value
    model_preset: str = option(
        "tiny", "tiny | base | large | gpt-base | gpt-large | elmo-base | elmo-large (PRESETS)",
        choices=tuple(PRESETS),
    )
    layout: str | None = option(
        None, "bert | gpt | elmo: the reference code's variant (the gpt and elmo presets set it)",
        choices=(None, *LAYOUTS),
    )
    tower_type: str | None = option(
        None, "transformer | lstm | ssm (None: the layout's; lstm in the bert layout: this package's LSTM towers, as "
        "in recipes tiny_lstm and tiny_elmo; ssm: Mamba-style selective state-space towers, recipe tiny_ssm)",
        choices=(None, *TOWER_TYPES),
    )
    num_towers: int | None = option(None, "towers of the model (at least 2)")
    hidden_size: int | None = option(None, "width of ONE tower")
    num_hidden_layers: int | None = option(None, "layers per tower")
    num_attention_heads: int | None = option(None, "heads per tower")
    intermediate_size: int | None = option(None, "MLP width of one tower")
    lstm_hidden_size: int | None = option(None, "LSTM towers (elmo presets): cell size")
    embedding_size: int | None = option(
        None, "shared embedding and tied decoder; None = the layout's (bert: num_towers * hidden_size; gpt: "
        "hidden_size); hidden_size in the bert layout: about the FLOPs of a GPT-2 as deep as all towers",
    )
    cooperative: bool | None = option(None, "False: the independent-towers control (one LM head and loss per tower)")
    separate_embeddings: bool | None = option(
        None, "bert layout: each tower its own slice of the embedding (with cooperative false, towers that share no"
        " parameter at all)",
    )
    tower_heads: bool | None = option(
        None, "cooperative: each tower also its own LM head and loss, added to the joint loss (the joint-gradient "
        "experiment)",
    )
    joint_gradient: bool | None = option(
        None, "False (with tower_heads true): the joint loss's gradient stops at the towers' outputs, so the towers "
        "learn from their own heads' losses only",
    )
    sparse_prediction: bool | None = option(
        None, "masked objective: the LM head runs on the masked positions only (the same loss; ~1.5x faster steps "
        "for the tiny preset's 4096-token vocabulary)",
    )
    max_position_embeddings: int | None = option(None, "positions; must be >= block_size")
    hidden_dropout: float | None = option(
        None, "dropout of the towers' hidden states",
        bounds=Bounds(0, 1, high_open=True), unset="keep the preset's",
    )
    attention_dropout: float | None = option(
        None, "dropout of the attention weights",
        bounds=Bounds(0, 1, high_open=True), unset="keep the preset's",
    )
    initialization: str | None = option(
        None, "normal | reference (the reference code's; the paper-sized presets set it)",
        choices=(None, *INITIALIZATIONS),
    )
    gradient_checkpointing: bool = option(False, "recompute activations in backward: less memory, ~30% more compute")
    torch_compile: bool = option(False, "torch.compile the model (inductor); pays a compile time up front")

    # optimisation (the paper's defaults)
    learning_rate: float = option(1e-3, "peak learning rate, reached after warm-up", bounds=above(0))
    adam_beta1: float = option(0.9, "AdamW's first-moment decay", bounds=Bounds(0, 1, high_open=True))
    adam_beta2: float = option(0.98, "AdamW's second-moment decay", bounds=Bounds(0, 1, high_open=True))
    adam_epsilon: float = option(1e-8, "the paper does not set it; torch's default", bounds=above(0))
    weight_decay: float = option(
        0.01, "AdamW's decoupled decay of every parameter weight_decay_exclude leaves",
        bounds=at_least(0),
    )
    weight_decay_exclude: str = option(
        "norms_and_biases",
        "parameters not decayed: norms_and_biases | tower_norms_and_biases (the reference BERT's: every bias "
        "and the norms inside the towers' layers; the embedding, fusion and probe norms decay) | none (the "
        "reference GPT's and ELMo's: everything decays)",
        choices=WEIGHT_DECAY_EXCLUSIONS,
    )
    max_grad_norm: float = option(1.0, "gradient clipping; 0 disables", bounds=at_least(0, "0 disables clipping"))
    lr_scheduler_type: str = option(
        "linear", "any transformers.get_scheduler name; linear = warm-up then linear decay",
        choices=LR_SCHEDULERS,
    )
    num_warmup_steps: int = option(0, "optimizer steps of linear warm-up", bounds=at_least(0))
    per_device_train_batch_size: int = option(16, "sequences per process per micro-batch", bounds=at_least(1))
    per_device_eval_batch_size: int = option(32, "sequences per process per validation batch", bounds=at_least(1))
    gradient_accumulation_steps: int = option(
        1, "micro-batches per optimizer step global batch = per_device_train_batch_size * "
        "gradient_accumulation_steps * number of processes",
        bounds=at_least(1),
    )
    num_train_epochs: int = option(1, "epochs, unless max_train_steps is set", bounds=at_least(1))
    max_train_steps: int | None = option(
        None, "optimizer steps; when set, overrides num_train_epochs",
        bounds=at_least(1), unset="train --num_train_epochs epochs",
    )
    mixed_precision: str | None = option(
        None, "no | fp16 | bf16; None = what `accelerate launch`/config says",
        choices=(None, *MIXED_PRECISIONS),
    )
    seed: int = option(
        42, "seeds weights, dropout and data order: equal seeds give equal runs",
        bounds=Bounds(0, MAX_SEED),
    )
    cpu: bool = option(False, "train on CPU even when a GPU is present")

    # phase
    phase: str = option(
        "pretrain", "pretrain (phase 1, joint model) | probe (phases 2 and 3, frozen model)",
        choices=PHASES,
    )
    pretrained_model: str | None = option(None, "probe phase: folder of a pretrained two-tower model")
    probe_chunk_size: int | None = option(
        None, "positions per chunk of the probes' vocabulary projection in validation and L-BFGS (AdamW steps "
        "compute the loss without logits, in pieces of their own)",
        bounds=at_least(1), unset="let the probes choose",
    )
    probe_replicas: int = option(
        1, "probes per tower, each its own initial weights and (mlp) its own data order",
        bounds=at_least(1, "probes per tower"),
    )
    probe_type: str = option(
        "mlp", "mlp (the paper's probe; AdamW) | linear (softmax regression solved by L-BFGS)",
        choices=PROBE_TYPES,
    )
    probe_feature_cache: str = option(
        "memory", "memory (on the device) | disk (numpy memmaps under output_dir, removed at the end of the run: for "
        "caches beyond device memory) | none (recompute the frozen towers over the blocks each step reads, as"
        " the reference did; with probe_backbone_dropout, new dropout at every read, where a cache keeps one "
        "draw per block) | auto (memory if the cache fits in half the free device memory, else disk if it "
        "fits in probe_cache_max_gb, else none; printed with the size before the towers run). Kept in the "
        "training precision",
        choices=PROBE_FEATURE_CACHES,
    )
    probe_cache_max_gb: float | None = option(
        None, "auto: the largest disk cache in GB (1e9 bytes), of all processes; None = half the output folder's "
        "free disk",
        bounds=above(0, "GB"), unset="allow half the output folder's free disk",
    )
    probe_batch_positions: int | None = option(
        None, "cached positions per probe step and process; None = the positions of per_device_train_batch_size * "
        "gradient_accumulation_steps blocks, as much data as a step of blocks",
        bounds=at_least(1), unset="use the positions of a step of blocks",
    )
    probe_l2: float = option(
        1e-3, "linear probes: lambda of the penalty lambda/2 * (||W||^2 + ||b||^2) on the mean NLL; of 1e-4, 1e-3, "
        "1e-2 and 3e-2 on the tiny model's features, 1e-3 gave the lowest validation loss (1e-4 overfit)",
        bounds=at_least(0),
    )
    probe_tolerance: float = option(
        1e-4, "linear probes: L-BFGS stops when no gradient entry exceeds it",
        bounds=above(0),
    )
    probe_grad_clipping: str = option(
        "joint", "joint: max_grad_norm bounds the norm of every probe's gradient together (the tiny recipes', whose "
        "figures it keeps) | per_probe: each probe's own, so probes trained in one run step as in runs of "
        "their own, as the reference trained them (the paper recipes)",
        choices=PROBE_GRAD_CLIPPINGS,
    )
    probe_replica_data: str = option(
        "shared", "shared: every replica reads all the training blocks, each in its own order | disjoint: the blocks "
        "cut into probe_replicas contiguous slices, replica r (of every tower) reading slice r only, so that "
        "replicas share no training text (cross-fitting: a preference two such probes agree on is not what "
        "one slice of text taught them); the slices are equal, a remainder of fewer blocks than replicas "
        "unread",
        choices=PROBE_REPLICA_DATA,
    )
    probe_backbone_dropout: bool = option(
        False, "cache the training features with the frozen model in train mode (dropout on: one draw per block, "
        "from the seed, static like the masks), as the reference's backbone ran in its probe phase; "
        "validation features stay dropout-free. Off by default: on the tiny recipe it left the preference as "
        "it was within noise and cost 0.9% probe perplexity (docs/FAITHFULNESS.md); the paper probe recipes "
        "set it",
    )

    # checkpointing
    output_dir: str = option("outputs/twotower", "model/ (final), checkpoints/, runs/ (TensorBoard) go here")
    checkpointing_steps: int | None = option(
        None, "save_state every N optimizer steps (and at each epoch's end)",
        bounds=at_least(1), unset="checkpoint at the end of each epoch only",
    )
    checkpoints_total_limit: int = option(2, "keep only the last K checkpoints", bounds=at_least(1, "checkpoints kept"))
    resume_from_checkpoint: str | None = option(None, "\"latest\" (in output_dir/checkpoints) or a checkpoint folder")
    overwrite_output_dir: bool = option(
        False, "a new run in a folder that holds an earlier run removes its checkpoints/, model/, runs/ and feature "
        "cache first (other files stay); without it such a folder is refused",
    )
    allow_config_change: bool = option(
        False, "resume although options that change the result (seed, data, model, schedule, batch...) differ from "
        "the checkpoint's, or its data files changed (their sha256 is in each checkpoint); without it such a "
        "resume is refused",
    )

    # logging
    logging_steps: int = option(10, "optimizer steps between log lines", bounds=at_least(1))
    eval_steps: int | None = option(
        None, "evaluate every N optimizer steps (and at each epoch's end)",
        bounds=at_least(1), unset="evaluate at the end of each epoch only",
    )
    report_to: str = option("tensorboard", "accelerate tracker(s), comma-separated: tensorboard, wandb, all, none")
    peak_tflops: float | None = option(
        None, "device peak in TFLOP/s for MFU; None = measured with a matmul at start",
        bounds=above(0), unset="measure the device's peak at the start",
    )
    disable_tqdm: bool = option(False, "hide the progress bar (shown on the main process only)")

    # early stopping on the validation loss: the joint model's (pretrain), the mean over the probes' (probe)
    early_stopping_patience: int | None = option(
        None, "stop after N evaluations in a row without improvement and save the best evaluation's weights; needs "
        "eval_steps; None = off. A resumed run starts counting afresh.",
        bounds=at_least(1, "evaluations without improvement before stopping"), unset="train without early stopping",
    )
    early_stopping_threshold: float = option(
        0.0, "minimum decrease of the validation loss that counts as an improvement (smaller gains are noise: the "
        "weights kept are those of the last evaluation that improved by more)",
        bounds=at_least(0),
    )

    # hub
    push_to_hub: bool = option(False, "upload the final model folder with huggingface_hub")
    hub_model_id: str | None = option(None, "\"user/name\" of the model repository")
    hub_private_repo: bool = option(False, "create the Hub repository private")

    def __post_init__(self):
        """Every option checked now, whichever way it came (command line, recipe, Python), before any long work."""
        check_types_and_choices(self)  # their ranges after the checks across options, whose messages say more
        unknown_trackers = [name for name in self.report_to.split(",") if name.strip() not in TRACKERS]
        if unknown_trackers:
            raise TwoTowerUserError(
                f"`report_to` is {self.report_to!r}: {unknown_trackers} are not trackers; use a comma-separated "
                f"list of {list(TRACKERS)}."
            )
        if not self.output_dir.strip():
            raise TwoTowerUserError("`output_dir` is empty; pass --output_dir FOLDER for the model and checkpoints.")
        if self.phase == "probe" and self.pretrained_model is None:
            raise TwoTowerUserError("The probe phase needs `--pretrained_model DIR`, the folder of a pretrained model.")
        self._check_probe_options()
        self._check_block_format()
        if self.early_stopping_patience is not None and not self.eval_steps:
            raise TwoTowerUserError(
                "`early_stopping_patience` watches the validation loss: it needs `--eval_steps N` (evaluate every N "
                "optimizer steps)."
            )
        check_ranges(self)
        self._check_model()
        if self.push_to_hub and not self.hub_model_id:
            raise TwoTowerUserError("`--push_to_hub` needs `--hub_model_id user/name`.")
        if self.hub_model_id is not None:
            check_repo_id(self.hub_model_id, "`hub_model_id`")

    def _check_block_format(self):
        if self.block_format == "sentence_pairs" and self.phase == "pretrain" and self.tokenizer_name_or_path is None:
            raise TwoTowerUserError(
                "--block_format sentence_pairs needs [CLS], [SEP] and [PAD] tokens, which the BPE a run trains "
                "has not: pass --tokenizer_name_or_path with a BERT WordPiece vocabulary (e.g. a folder holding "
                "bert-base-uncased's vocab.txt)."
            )

    def _check_probe_options(self):
        if self.phase == "probe" and self.probe_type == "linear" and self.probe_feature_cache == "none":
            raise TwoTowerUserError(
                "--probe_type linear runs full-batch L-BFGS over cached features, and --probe_feature_cache none "
                "caches none: pass --probe_feature_cache memory, disk or auto (which refuses a cache over its budget)."
            )
        if self.phase == "probe" and self.probe_type == "linear" and not self.max_train_steps:
            raise TwoTowerUserError(
                "--probe_type linear trains by L-BFGS iterations, one a step over the whole cache: set "
                "--max_train_steps N (the most iterations, e.g. 500); it stops earlier at --probe_tolerance."
            )
        if self.phase == "probe" and self.probe_type == "linear" and self.probe_replica_data == "disjoint":
            raise TwoTowerUserError(
                "--probe_replica_data disjoint gives each MLP probe replica its own slice of the blocks, and "
                "--probe_type linear solves every probe over the whole cache: pass --probe_type mlp, or drop "
                "--probe_replica_data (shared)."
            )
        if self.phase == "pretrain":
            defaults = {field.name: field.default for field in dataclasses.fields(self)}
            names = ("probe_replicas", "probe_type", "probe_feature_cache", "probe_cache_max_gb",
                     "probe_batch_positions", "probe_l2", "probe_tolerance", "probe_grad_clipping",
                     "probe_backbone_dropout", "probe_replica_data")
            changed = [f"--{name} {getattr(self, name)}" for name in names if getattr(self, name) != defaults[name]]
            if changed:
                raise TwoTowerUserError(
                    f"{', '.join(changed)} only apply to the probe phase; drop them, or train probes with "
                    f"`--phase probe --pretrained_model DIR`."
                )

    def _check_model(self):
        """The architecture a pretrain run would build, and the vocabulary of the tokenizer it would train."""
        if self.phase != "pretrain":
            return  # the pretrained model's architecture, checked when its folder is read
        try:
            model_config = TwoTowerConfig.from_preset(self.model_preset, **self.model_overrides())
        except ValueError as error:
            raise TwoTowerUserError(f"{error} (model options over --model_preset {self.model_preset})") from error
        self.check_block_size(model_config, " or raise --max_position_embeddings")
        if self.sparse_prediction and self.objective != "masked":
            raise TwoTowerUserError(
                f"--sparse_prediction predicts masked positions only; the objective is {self.objective or 'causal'}, "
                "where every position is a target: drop --sparse_prediction or pass --objective masked."
            )
        special_tokens = 3 if self.objective == "masked" else 1  # <|endoftext|> (+ <pad>, <mask>)
        if self.tokenizer_name_or_path is None and self.tokenizer_vocab_size < BYTE_LEVEL_ALPHABET + special_tokens:
            raise TwoTowerUserError(
                f"`tokenizer_vocab_size` must be >= {BYTE_LEVEL_ALPHABET + special_tokens} (the 256 bytes and "
                f"{special_tokens} special token(s) of a trained BPE), got {self.tokenizer_vocab_size}."
            )

    def model_overrides(self) -> dict:
        """The model fields set in this config, to apply over `model_preset`."""
        names = ("layout", "num_towers", "tower_type", "hidden_size", "num_hidden_layers", "num_attention_heads")
        names += ("intermediate_size", "lstm_hidden_size", "embedding_size", "cooperative", "separate_embeddings",
                  "tower_heads", "joint_gradient", "max_position_embeddings")
        names += ("hidden_dropout", "attention_dropout", "initialization", "sparse_prediction")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def resolve_recipe_path(recipe: str, recipes_dir: Path = RECIPES_DIR, extended_by: Path | None = None) -> Path:
    """
    A file that exists is that recipe (YAML, or JSON when its name ends in .json); a name ending in .yaml, .yml or
    .json is a path; any other name (`tiny`) is a file of recipes_dir. `extended_by`: the recipe whose `extends`
    names it, for the error.
    """
    path = Path(recipe).expanduser()
    if not path.is_file() and path.suffix not in RECIPE_SUFFIXES:
        path = recipes_dir / f"{recipe}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in recipes_dir.glob("*.yaml"))
        missing = f"Recipe {recipe!r} not found"
        if extended_by is not None:  # the file to fix is the one that names it
            missing = f"Recipe {extended_by} extends {recipe!r}, which is not found"
        raise FileNotFoundError(f"{missing} (looked for {path}); known recipes: {known}.")
    return path


def _recipe_file_values(path: Path, fields: list[str], config_name: str) -> dict:
    """The options one recipe file sets, as written (its `extends` not yet followed), checked against `fields`."""
    values = read_recipe_file(path) or {}
    if not isinstance(values, dict):
        raise TwoTowerUserError(f"Recipe {path} holds a {type(values).__name__}; write one `option: value` per line.")
    values = {name: value for name, value in values.items() if name not in RUN_RECORDS}
    unknown = sorted(set(values) - {*fields, "extends"})
    if unknown:
        raise TwoTowerUserError(
            f"Recipe {path} sets unknown options {unknown}{closest_name(unknown[0], fields)}; see {config_name} for the "
            f"names."
        )
    return values


def read_recipe(recipe: str, config_class=TwoTowerTrainingConfig, recipes_dir: Path = RECIPES_DIR) -> dict:
    """
    The options a recipe sets, checked against the fields of `config_class`. A recipe may start from another with
    `extends: PARENT` (a recipe name of recipes_dir, or a YAML or JSON path beside it): the parent's options, resolved
    the same way, overridden by the recipe's own.
    """
    return _read_extended_recipe(recipe, config_class, recipes_dir, chain=())


def _read_extended_recipe(recipe: str, config_class, recipes_dir: Path, chain: tuple[Path, ...]) -> dict:
    """read_recipe, refusing a recipe already in `chain` (the recipe files that extend it, outermost first)."""
    path = resolve_recipe_path(recipe, recipes_dir, extended_by=chain[-1] if chain else None)
    if path.resolve() in {link.resolve() for link in chain}:
        cycle = " -> ".join(link.stem for link in (*chain, path))
        raise TwoTowerUserError(f"Recipes extend each other in a cycle ({cycle}); remove one of these `extends`.")
    fields = [field.name for field in dataclasses.fields(config_class)]
    values = _recipe_file_values(path, fields, config_class.__name__)
    parent = values.pop("extends", None)
    if parent is None:
        return values
    if not isinstance(parent, str) or not parent.strip():
        raise TwoTowerUserError(f"Recipe {path} sets `extends: {parent!r}`; name one recipe (e.g. `extends: tiny`).")
    if Path(parent).suffix in RECIPE_SUFFIXES:
        parent = str(path.parent / parent)
    inherited = _read_extended_recipe(parent, config_class, recipes_dir, (*chain, path))
    return {**inherited, **values}


def load_config(recipe_path: str | None = None, cli_args: list[str] | None = None) -> TwoTowerTrainingConfig:
    """Defaults < recipe (YAML) < command line (`--key value`); returns the resolved config."""
    defaults = {}
    if recipe_path is not None:  # a saved config names the recipe it came from
        values = convert_values(TwoTowerTrainingConfig, read_recipe(recipe_path), recipe_path)
        defaults = {**values, "recipe": recipe_path}
    (config,) = OptionsParser(TwoTowerTrainingConfig).parse(cli_args or [], defaults)
    return config


def save_config(config: TwoTowerTrainingConfig, folder: str | os.PathLike, records: dict | None = None) -> Path:
    """
    Write the resolved config as a recipe (`--recipe FOLDER/training_config.yaml` reruns it), atomically, followed
    by `records` of the run (keys of RUN_RECORDS, which recipes skip).
    """
    text = yaml.safe_dump({**dataclasses.asdict(config), **(records or {})}, sort_keys=False)
    return write_text_atomically(Path(folder) / RESOLVED_CONFIG_NAME, text)
