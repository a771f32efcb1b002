"""
The run a training phase prepares before its loop: data, model, optimizer, schedule, one `prepare` call,
throughput accounting and the resumed position (training/train.py steps through it).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import PreTrainedTokenizerBase, get_scheduler, set_seed

from .arguments import TwoTowerTrainingConfig
from .checkpointing import load_checkpoint
from .collective import on_main_process
from .data import load_raw_datasets, make_dataloaders, split_blocks, tokenize_and_group
from .linear_probes import check_linear_probes_fit
from .objectives import make_collators
from .phases import build_model, make_loss_function, make_optimizer, trained_module
from .probe_cache import batch_positions, cache_both_splits, process_counts
from .run_folder import check_free_space, run_disk_bytes
from .sharding import configure_fsdp
from .throughput import flops_per_token, resolve_peak_flops
from .tokenizer import build_tokenizer


def get_datasets(
    config: TwoTowerTrainingConfig, accelerator: Accelerator, objective: str, tower_type: str, resume_checkpoint=None
):
    """Raw text -> tokenizer -> blocks of block_size tokens: (tokenizer, train and validation blocks, collators)."""
    with accelerator.main_process_first():
        raw_datasets = load_raw_datasets(
            config.dataset_name, config.dataset_config_name, config.train_file, config.validation_file
        )
    tokenizer = build_tokenizer(config, raw_datasets["train"], accelerator, resume_checkpoint, objective == "masked")
    collators = make_collators(objective, tower_type, tokenizer, config.mlm_probability, config.seed)
    with accelerator.main_process_first():  # the main process tokenizes; the others read its cache
        lm_datasets = tokenize_and_group(
            raw_datasets, tokenizer, config.block_size, config.text_column_name,
            config.preprocessing_num_workers, config.overwrite_cache, config.block_format,
        )
        lm_datasets = split_blocks(
            lm_datasets, config.block_size, config.validation_split_percentage,
            config.max_train_blocks, config.max_eval_blocks,
        )
    return tokenizer, lm_datasets, collators


@dataclass
class TrainingRun:
    """What the loop reads, built once by prepare_run: the prepared objects, the step counts, where to start."""

    config: TwoTowerTrainingConfig
    accelerator: Accelerator
    objective: str
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module  # the whole model, unwrapped (frozen in the probe phase)
    trained: torch.nn.Module  # what the optimizer steps, prepared: the model (pretrain) or its probes (probe)
    optimizer: torch.optim.Optimizer
    lr_scheduler: object
    loss_function: object
    steps_per_epoch: int
    units_per_epoch: int  # what an epoch holds for this process: batches (pretrain) or probe steps (probe)
    max_train_steps: int
    eval_chunk: int  # cached positions per validation chunk, as many as in a batch of blocks
    caches: dict | None = None  # probe phase: the frozen towers' features, "train" and "validation" (cached or not)
    positions_per_step: int | None = None  # mlp probes: positions per step and process
    train_dataloader: object = None  # pretrain phase
    eval_dataloader: object = None
    train_flops_per_token: float = 0.0
    peak_flops: float = 0.0
    tokens_per_batch: int = 0  # tokens of one micro-batch over all processes
    resumed_steps: int = 0  # where the loop starts: steps taken, epoch, and units of that epoch already taken
    starting_epoch: int = 0
    units_to_skip: int = 0

    @property
    def is_probe(self) -> bool:
        return self.config.phase == "probe"

    @property
    def is_linear(self) -> bool:
        return self.is_probe and self.config.probe_type == "linear"

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.max_train_steps / self.steps_per_epoch)


def plan_epochs(config: TwoTowerTrainingConfig, accelerator, model, lm_datasets, collators, objective: str) -> dict:
    """
    The data the loop steps over, and the steps per epoch. Pretraining steps over windows of blocks (accelerate
    shards the batches and steps the scheduler once per process, hence the factors; an accelerate config may set the
    accumulation steps: the accelerator's value is the one in force). The probe phase runs the frozen towers once and
    steps over the cached positions of this process's blocks (or, with --probe_feature_cache none, over positions it
    recomputes): batches of positions in each replica's order of the blocks (mlp), or the full batch (linear, L-BFGS).
    """
    if config.phase == "probe":
        caches = cache_both_splits(accelerator, model, lm_datasets, collators, objective, config)
        steps_per_epoch, positions_per_step = 1, None  # linear: an L-BFGS iteration reads the full batch
        if config.probe_type != "linear":
            positions_per_step = batch_positions(accelerator, caches["train"], config)
            # every process takes the same number of steps; the last of an epoch takes what its share has left
            steps_per_epoch = math.ceil(min(process_counts(accelerator, len(caches["train"]))) / positions_per_step)
        return {"caches": caches, "positions_per_step": positions_per_step, "steps_per_epoch": steps_per_epoch,
                "units_per_epoch": steps_per_epoch}
    train_dataloader, eval_dataloader = make_dataloaders(
        lm_datasets, config.per_device_train_batch_size, config.per_device_eval_batch_size, *collators
    )
    units_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes)  # batches of this process
    return {"train_dataloader": train_dataloader, "eval_dataloader": eval_dataloader,
            "units_per_epoch": units_per_epoch,
            "steps_per_epoch": math.ceil(units_per_epoch / accelerator.gradient_accumulation_steps)}


def prepare_run(config: TwoTowerTrainingConfig, accelerator, model_config, objective: str, resume_checkpoint):
    """Data, model, optimizer, schedule, one `prepare` call, throughput accounting, resume: a TrainingRun."""
    is_linear = config.phase == "probe" and config.probe_type == "linear"
    if is_linear:
        check_linear_probes_fit(accelerator)
    set_seed(config.seed)  # before the model is built, so that the seed also controls the new weights

    # Data, model, optimizer: the whole model trains in pretraining, only the probes in the probe phase
    tokenizer, lm_datasets, collators = get_datasets(
        config, accelerator, objective, model_config.tower_type, resume_checkpoint
    )
    model = build_model(config, model_config, tokenizer, objective)
    trained = trained_module(config, model, accelerator.device)
    configure_fsdp(accelerator, trained)  # before the optimizer, which must hold the tower stacks' sharded weights
    optimizer = make_optimizer(config, trained)
    checkpoint_bytes, model_bytes = run_disk_bytes(model, trained, optimizer)
    on_main_process(accelerator, lambda: check_free_space(
        config.output_dir, checkpoint_bytes, model_bytes, config.checkpoints_total_limit
    ))
    plan = plan_epochs(config, accelerator, model, lm_datasets, collators, objective)
    max_train_steps = config.max_train_steps or config.num_train_epochs * plan["steps_per_epoch"]
    lr_scheduler = get_scheduler(
        "constant" if is_linear else config.lr_scheduler_type,  # L-BFGS sizes its steps by line search, at lr 1
        optimizer=optimizer,
        num_warmup_steps=config.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )

    # Prepare everything (in the probe phase the frozen backbone stays outside, unwrapped)
    if config.phase == "probe":
        trained, optimizer, lr_scheduler = accelerator.prepare(trained, optimizer, lr_scheduler)
    else:
        trained, optimizer, plan["train_dataloader"], plan["eval_dataloader"], lr_scheduler = accelerator.prepare(
            trained, optimizer, plan["train_dataloader"], plan["eval_dataloader"], lr_scheduler
        )
    run = TrainingRun(
        config, accelerator, objective, tokenizer, model, trained, optimizer, lr_scheduler,
        make_loss_function(config, trained), max_train_steps=max_train_steps,
        eval_chunk=config.per_device_eval_batch_size * config.block_size, **plan,
    )
    start_accounting(run)
    if resume_checkpoint is not None:
        resume(run, resume_checkpoint)
    return run


def start_accounting(run: TrainingRun) -> None:
    """Trackers, and what throughput and MFU are measured against."""
    config, accelerator = run.config, run.accelerator
    accelerator.init_trackers(config.phase, config=vars(config))
    run.train_flops_per_token = flops_per_token(run.model.config, config.block_size, config.phase)
    matmul_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, torch.float32)
    run.peak_flops, peak_source = resolve_peak_flops(accelerator.device, matmul_dtype, config.peak_tflops)
    accelerator.print(f"MFU peak: {run.peak_flops / 1e12:.3g} TFLOP/s per device ({peak_source})")
    run.tokens_per_batch = config.per_device_train_batch_size * config.block_size * accelerator.num_processes


def resume(run: TrainingRun, checkpoint: Path) -> None:
    """Weights, optimizer, scheduler and RNG states, and the position in the data."""
    progress = load_checkpoint(run.accelerator, checkpoint, run.steps_per_epoch)
    run.resumed_steps, run.starting_epoch = progress["completed_steps"], progress["epoch"]
    run.units_to_skip = progress["batches_into_epoch"]
    run.accelerator.print(f"Resumed from {checkpoint} at step {run.resumed_steps}")
