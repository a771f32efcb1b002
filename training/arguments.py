"""Every knob of a training run in one dataclass, and how recipes and the command line fill it in."""

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from modeling_twotower.configuration_twotower import PRESETS, PROBE_TYPES, TOWER_TYPES

from .atomic import write_text_atomically

from .objectives import OBJECTIVES

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
PHASES = ("pretrain", "probe")
MIXED_PRECISIONS = ("no", "fp16", "bf16")
PROBE_FEATURE_CACHES = ("memory", "disk")
RESOLVED_CONFIG_NAME = "training_config.yaml"
RUN_RECORDS = ("probe_runs",)  # what a run writes about itself into its resolved config: read back, never options


@dataclass
class TwoTowerTrainingConfig:
    # recipe
    recipe: str | None = None  # a recipe name in training/recipes (tiny, base_probe, ...) or a YAML path

    # data
    dataset_name: str = "wikitext"  # Hub dataset, used when train_file is not set
    dataset_config_name: str | None = "wikitext-2-raw-v1"
    text_column_name: str = "text"  # column of the Hub dataset holding raw text
    train_file: str | None = None  # local text: a .txt file, a folder of .txt files or a glob; replaces dataset_name
    validation_file: str | None = None  # same forms; without it (or a validation split) train is split
    validation_split_percentage: float = 5.0  # % of train blocks held out, chosen with a fixed seed
    block_size: int = 128  # tokens per training sequence (the paper's context length)
    max_train_blocks: int | None = None  # use only the first N training blocks (quick runs); None = all
    max_eval_blocks: int | None = None  # use only the first N validation blocks; None = all
    preprocessing_num_workers: int | None = None  # processes for datasets.map; None = one
    overwrite_cache: bool = False  # re-tokenize instead of reusing the datasets cache

    # tokenizer
    tokenizer_name_or_path: str | None = None  # Hub name, saved tokenizer, or a folder with bert vocab.txt or
    # gpt2 vocab.json + merges.txt; None = train a byte-level BPE on the training text (pretrain) or use the
    # tokenizer saved with pretrained_model (probe)
    tokenizer_vocab_size: int = 8192  # vocabulary of a newly trained BPE tokenizer

    # objective: None = causal when pretraining, the pretrained model's in the probe phase
    objective: str | None = None  # causal (next token, TwoTowerForCausalLM) | masked (TwoTowerForMaskedLM)
    mlm_probability: float = 0.15  # masked transformer towers: share of tokens selected (80/10/10 replaced)

    # model (pretrain phase): a preset plus optional overrides; None keeps the preset's value
    model_preset: str = "tiny"  # tiny | base | large | elmo-base | elmo-large (modeling_twotower PRESETS)
    tower_type: str | None = None  # transformer | lstm (ELMo-style; the elmo presets set it)
    num_towers: int | None = None
    hidden_size: int | None = None  # width of ONE tower
    num_hidden_layers: int | None = None  # layers per tower
    num_attention_heads: int | None = None  # heads per tower
    intermediate_size: int | None = None  # MLP width of one tower
    lstm_hidden_size: int | None = None  # LSTM towers (elmo presets): cell size
    embedding_size: int | None = None  # shared embedding and tied decoder; None = num_towers * hidden_size (the
    # paper's); hidden_size = the reference code's GPT variant, about the FLOPs of a GPT-2 as deep as all towers
    cooperative: bool | None = None  # False: the independent-towers control (one LM head and loss per tower)
    max_position_embeddings: int | None = None  # positions; must be >= block_size
    hidden_dropout: float | None = None
    attention_dropout: float | None = None
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% more compute
    torch_compile: bool = False  # torch.compile the model (inductor); pays a compile time up front

    # optimisation (the paper's defaults)
    learning_rate: float = 1e-3  # peak learning rate, reached after warm-up
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-8  # the paper does not set it; torch's default
    weight_decay: float = 0.01  # applied to all weights except norms and biases
    max_grad_norm: float = 1.0  # gradient clipping; 0 disables
    lr_scheduler_type: str = "linear"  # any transformers.get_scheduler name; linear = warm-up then linear decay
    num_warmup_steps: int = 0  # optimizer steps of linear warm-up
    per_device_train_batch_size: int = 16  # sequences per process per micro-batch
    per_device_eval_batch_size: int = 32
    gradient_accumulation_steps: int = 1  # micro-batches per optimizer step
    # global batch = per_device_train_batch_size * gradient_accumulation_steps * number of processes
    num_train_epochs: int = 1
    max_train_steps: int | None = None  # optimizer steps; when set, overrides num_train_epochs
    mixed_precision: str | None = None  # no | fp16 | bf16; None = what `accelerate launch`/config says
    seed: int = 42  # seeds weights, dropout and data order: equal seeds give equal runs
    cpu: bool = False  # train on CPU even when a GPU is present

    # phase
    phase: str = "pretrain"  # pretrain (phase 1, joint model) | probe (phases 2 and 3, frozen model)
    pretrained_model: str | None = None  # probe phase: folder of a pretrained two-tower model
    probe_chunk_size: int | None = None  # positions per chunk of the probes' vocabulary projection
    probe_replicas: int = 1  # probes per tower, each its own initial weights and (mlp) its own data order
    probe_type: str = "mlp"  # mlp (the paper's probe; AdamW) | linear (softmax regression solved by L-BFGS)
    probe_feature_cache: str = "memory"  # memory (on the device) | disk (numpy memmaps under output_dir, removed at
    # the end of the run: for caches beyond device memory)
    probe_batch_positions: int | None = None  # cached positions per probe step and process; None = the positions
    # of per_device_train_batch_size * gradient_accumulation_steps blocks, as much data as a step of blocks
    probe_l2: float = 1e-3  # linear probes: lambda of the penalty lambda/2 * (||W||^2 + ||b||^2) on the mean NLL;
    # of 1e-4, 1e-3, 1e-2 and 3e-2 on the tiny model's features, 1e-3 gave the lowest validation loss (1e-4 overfit)
    probe_tolerance: float = 1e-4  # linear probes: L-BFGS stops when no gradient entry exceeds it

    # checkpointing
    output_dir: str = "outputs/twotower"  # model/ (final), checkpoints/, runs/ (TensorBoard) go here
    checkpointing_steps: int | None = None  # save_state every N optimizer steps (and at each epoch's end)
    checkpoints_total_limit: int = 2  # keep only the last K checkpoints
    resume_from_checkpoint: str | None = None  # "latest" (in output_dir/checkpoints) or a checkpoint folder

    # logging
    logging_steps: int = 10  # optimizer steps between log lines
    eval_steps: int | None = None  # evaluate every N optimizer steps (and at each epoch's end)
    report_to: str = "tensorboard"  # accelerate tracker(s), comma-separated: tensorboard, wandb, all, none
    peak_tflops: float | None = None  # device peak in TFLOP/s for MFU; None = measured with a matmul at start
    disable_tqdm: bool = False  # hide the progress bar (shown on the main process only)

    # early stopping on the validation loss: the joint model's (pretrain), the mean over the probes' (probe)
    early_stopping_patience: int | None = None  # stop after N evaluations in a row without improvement and save
    # the best evaluation's weights; needs eval_steps; None = off. A resumed run starts counting afresh.
    early_stopping_threshold: float = 0.0  # minimum decrease of the validation loss that counts as an improvement
    # (smaller gains are noise: the weights kept are those of the last evaluation that improved by more)

    # hub
    push_to_hub: bool = False  # upload the final model folder with huggingface_hub
    hub_model_id: str | None = None  # "user/name" of the model repository
    hub_private_repo: bool = False

    def __post_init__(self):
        choices = {
            "phase": PHASES,
            "model_preset": tuple(PRESETS),
            "mixed_precision": (None, *MIXED_PRECISIONS),
            "objective": (None, *OBJECTIVES),
            "tower_type": (None, *TOWER_TYPES),
            "probe_type": PROBE_TYPES,
            "probe_feature_cache": PROBE_FEATURE_CACHES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` is {getattr(self, name)!r}; choose one of {list(allowed)}.")
        for name in ("block_size", "per_device_train_batch_size", "per_device_eval_batch_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"`{name}` must be a positive integer, got {getattr(self, name)!r}.")
        if self.gradient_accumulation_steps <= 0:
            raise ValueError(f"`gradient_accumulation_steps` must be >= 1, got {self.gradient_accumulation_steps}.")
        if not 0 <= self.validation_split_percentage < 100:
            raise ValueError(
                f"`validation_split_percentage` must be in [0, 100), got {self.validation_split_percentage}."
            )
        if not 0.0 < self.mlm_probability < 1.0:
            raise ValueError(f"`mlm_probability` must be in (0, 1), got {self.mlm_probability!r}.")
        if self.phase == "probe" and self.pretrained_model is None:
            raise ValueError("The probe phase needs `--pretrained_model DIR`, the folder of a pretrained model.")
        self._check_probe_options()
        if self.early_stopping_patience is not None and self.early_stopping_patience < 1:
            raise ValueError(
                f"`early_stopping_patience` must be >= 1 (evaluations without improvement before stopping), got "
                f"{self.early_stopping_patience}; leave it unset to train without early stopping."
            )
        if self.early_stopping_patience is not None and not self.eval_steps:
            raise ValueError(
                "`early_stopping_patience` watches the validation loss: it needs `--eval_steps N` (evaluate every N "
                "optimizer steps)."
            )
        if self.early_stopping_threshold < 0:
            raise ValueError(f"`early_stopping_threshold` must be >= 0, got {self.early_stopping_threshold}.")
        if self.push_to_hub and not self.hub_model_id:
            raise ValueError("`--push_to_hub` needs `--hub_model_id user/name`.")

    def _check_probe_options(self):
        if not isinstance(self.probe_replicas, int) or self.probe_replicas < 1:
            raise ValueError(f"`probe_replicas` must be >= 1 (probes per tower), got {self.probe_replicas!r}.")
        if self.probe_batch_positions is not None and self.probe_batch_positions < 1:
            raise ValueError(
                f"`probe_batch_positions` must be >= 1, got {self.probe_batch_positions}; leave it unset for the "
                f"positions of a step of blocks."
            )
        if self.probe_l2 < 0 or self.probe_tolerance <= 0:
            raise ValueError(
                f"`probe_l2` must be >= 0 and `probe_tolerance` > 0, got {self.probe_l2} and {self.probe_tolerance}."
            )
        if self.phase == "probe" and self.probe_type == "linear" and not self.max_train_steps:
            raise ValueError(
                "--probe_type linear trains by L-BFGS iterations, one a step over the whole cache: set "
                "--max_train_steps N (the most iterations, e.g. 500); it stops earlier at --probe_tolerance."
            )
        if self.phase == "pretrain":
            defaults = {field.name: field.default for field in dataclasses.fields(self)}
            names = ("probe_replicas", "probe_type", "probe_feature_cache", "probe_batch_positions", "probe_l2",
                     "probe_tolerance")
            changed = [f"--{name} {getattr(self, name)}" for name in names if getattr(self, name) != defaults[name]]
            if changed:
                raise ValueError(
                    f"{', '.join(changed)} only apply to the probe phase; drop them, or train probes with "
                    f"`--phase probe --pretrained_model DIR`."
                )

    def model_overrides(self) -> dict:
        """The model fields set in this config, to apply over `model_preset`."""
        names = ("num_towers", "tower_type", "hidden_size", "num_hidden_layers", "num_attention_heads")
        names += ("intermediate_size", "lstm_hidden_size", "embedding_size", "cooperative", "max_position_embeddings")
        names += ("hidden_dropout", "attention_dropout")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}


def resolve_recipe_path(recipe: str, recipes_dir: Path = RECIPES_DIR) -> Path:
    """A recipe name (`tiny`) is a file of recipes_dir; anything else is a path to a YAML file."""
    path = Path(recipe)
    if path.suffix not in (".yaml", ".yml"):
        path = recipes_dir / f"{recipe}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in recipes_dir.glob("*.yaml"))
        raise FileNotFoundError(f"Recipe {recipe!r} not found (looked for {path}); known recipes: {known}.")
    return path


def read_recipe(recipe: str, config_class=TwoTowerTrainingConfig, recipes_dir: Path = RECIPES_DIR) -> dict:
    """The options a recipe sets, checked against the fields of `config_class`."""
    path = resolve_recipe_path(recipe, recipes_dir)
    values = yaml.safe_load(path.read_text()) or {}
    values = {name: value for name, value in values.items() if name not in RUN_RECORDS}
    fields = {field.name for field in dataclasses.fields(config_class)}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise ValueError(f"Recipe {path} sets unknown options {unknown}; see {config_class.__name__} for the names.")
    return values


def load_config(recipe_path: str | None = None, cli_args: list[str] | None = None) -> TwoTowerTrainingConfig:
    """Defaults < recipe (YAML) < command line (`--key value`); returns the resolved config."""
    parser = HfArgumentParser(TwoTowerTrainingConfig)
    if recipe_path is not None:
        parser.set_defaults(**{**read_recipe(recipe_path), "recipe": recipe_path})
    (config,) = parser.parse_args_into_dataclasses(args=cli_args or [], look_for_args_file=False)
    return config


def save_config(config: TwoTowerTrainingConfig, folder: str | os.PathLike, records: dict | None = None) -> Path:
    """
    Write the resolved config as a recipe (`--recipe FOLDER/training_config.yaml` reruns it), atomically, followed
    by `records` of the run (keys of RUN_RECORDS, which recipes skip).
    """
    text = yaml.safe_dump({**dataclasses.asdict(config), **(records or {})}, sort_keys=False)
    return write_text_atomically(Path(folder) / RESOLVED_CONFIG_NAME, text)
