"""
The run a training phase prepares before its loop: data, model, optimizer, schedule, one `prepare` call,
throughput accounting and the resumed position (training/train.py steps through it).
"""

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import Accelerator
from modeling_twotower.towers import tower_stack_class
from transformers import PreTrainedTokenizerBase, get_scheduler, set_seed

from ..arguments import TwoTowerTrainingConfig
from ..checkpoints.checkpointing import load_checkpoint, read_progress
from ..utils.collective import on_main_process
from ..data.blocks import load_raw_datasets, split_blocks, tokenize_and_group
from ..data.objectives import make_collators
from ..phases import TrainingPhase
from .run_folder import check_free_space, checkpoints_written, run_disk_bytes
from ..launch.sharding import configure_fsdp
from ..launch.throughput import flops_per_token, resolve_peak_flops
from ..data.tokenizer import build_tokenizer


def get_datasets(
    config: TwoTowerTrainingConfig, accelerator: Accelerator, objective: str, towers, resume_checkpoint=None
):
    """Raw text -> tokenizer -> blocks of block_size tokens: (tokenizer, train and validation blocks, collators)."""
    with accelerator.main_process_first():
        raw_datasets = load_raw_datasets(
            config.dataset_name, config.dataset_config_name, config.train_file, config.validation_file
        )
    tokenizer = build_tokenizer(config, raw_datasets["train"], accelerator, resume_checkpoint, objective == "masked")
    collators = make_collators(objective, towers, tokenizer, config.mlm_probability, config.seed)
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
    """
    What the loop reads, built once by prepare_run: the prepared objects, the step counts, where to start. What only
    one phase uses (dataloaders, feature caches, its optimizer and loss) the phase holds.
    """

    config: TwoTowerTrainingConfig
    phase: TrainingPhase
    accelerator: Accelerator
    objective: str
    tokenizer: PreTrainedTokenizerBase
    model: torch.nn.Module  # the whole model, unwrapped (frozen in the probe phase)
    trained: torch.nn.Module  # what the optimizer steps, prepared: the model (pretrain) or its probes (probe)
    lr_scheduler: object
    steps_per_epoch: int
    units_per_epoch: int  # what an epoch holds for this process: batches (pretrain) or probe steps (probe)
    max_train_steps: int
    train_flops_per_token: float = 0.0
    peak_flops: float = 0.0
    resumed_steps: int = 0  # where the loop starts: steps taken, epoch, and units of that epoch already taken
    starting_epoch: int = 0
    units_to_skip: int = 0

    @property
    def num_epochs(self) -> int:
        return math.ceil(self.max_train_steps / self.steps_per_epoch)


def prepare_run(config: TwoTowerTrainingConfig, phase: TrainingPhase, accelerator, model_config, objective: str,
                resume_checkpoint) -> TrainingRun:
    """Data, model, optimizer, schedule, one `prepare` call, throughput accounting, resume: a TrainingRun."""
    set_seed(config.seed)  # before the model is built, so that the seed also controls the new weights

    # Data, model, optimizer: the whole model trains in pretraining, only the probes in the probe phase
    tokenizer, lm_datasets, collators = get_datasets(
        config, accelerator, objective, tower_stack_class(model_config), resume_checkpoint
    )
    model = phase.build_model(model_config, tokenizer, objective)
    trained = phase.trained_module(model, accelerator.device)
    configure_fsdp(accelerator, trained)  # before the optimizer, which must hold the tower stacks' sharded weights
    optimizer = phase.make_optimizer(trained)
    steps_per_epoch, units_per_epoch = phase.build_data(accelerator, model, lm_datasets, collators, objective)
    max_train_steps = config.max_train_steps or config.num_train_epochs * steps_per_epoch
    # The disk must hold the checkpoints this run takes and the model (once the phase knows the epochs' steps)
    checkpoint_bytes, model_bytes = run_disk_bytes(model, trained, phase.optimizer_state_copies)
    first_step = 0 if resume_checkpoint is None else read_progress(resume_checkpoint)["completed_steps"]
    checkpoints = checkpoints_written(first_step, max_train_steps, config.checkpointing_steps, steps_per_epoch,
                                      phase.checkpoints_every_epoch)
    on_main_process(accelerator, lambda: check_free_space(
        config.output_dir, checkpoint_bytes, model_bytes, config.checkpoints_total_limit, checkpoints
    ))
    lr_scheduler = get_scheduler(
        phase.lr_scheduler_type or config.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=config.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )
    trained, lr_scheduler = phase.prepare(accelerator, trained, lr_scheduler)
    run = TrainingRun(config, phase, accelerator, objective, tokenizer, model, trained, lr_scheduler,
                      steps_per_epoch, units_per_epoch, max_train_steps)
    start_accounting(run)
    if resume_checkpoint is not None:
        resume(run, resume_checkpoint)
    return run


def start_accounting(run: TrainingRun) -> None:
    """Trackers, and what throughput and MFU are measured against."""
    config, accelerator = run.config, run.accelerator
    accelerator.init_trackers(run.phase.name, config=vars(config))
    run.train_flops_per_token = flops_per_token(run.model, config.block_size, run.phase.name)
    matmul_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, torch.float32)
    run.peak_flops, peak_source = resolve_peak_flops(accelerator.device, matmul_dtype, config.peak_tflops)
    accelerator.print(f"MFU peak: {run.peak_flops / 1e12:.3g} TFLOP/s per device ({peak_source})")


def resume(run: TrainingRun, checkpoint: Path) -> None:
    """Weights, optimizer, scheduler and RNG states, and the position in the data."""
    progress = load_checkpoint(run.accelerator, checkpoint, run.steps_per_epoch)
    run.resumed_steps, run.starting_epoch = progress["completed_steps"], progress["epoch"]
    run.units_to_skip = progress["batches_into_epoch"]
    run.accelerator.print(f"Resumed from {checkpoint} at step {run.resumed_steps}")
