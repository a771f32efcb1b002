"""
Train a two-tower language model (He & Toyoizumi 2022) with Accelerate, from raw text to a saved model.

Phase `pretrain` (the paper's phase 1) trains the joint model; phase `probe` (phases 2 and 3) freezes it, runs its
towers once over the data and trains `--probe_replicas` probes per tower on the cached features. Options come from
a recipe (training/recipes/*.yaml) overridden by `--key value`; `--help` lists them all. A run writes
OUTPUT_DIR/model (the final model in the Hub layout), OUTPUT_DIR/checkpoints and OUTPUT_DIR/runs (TensorBoard).

One CPU, the tiny recipe (minutes):
    python -m twotower.training.train --recipe tiny --output_dir outputs/tiny \
        --train_file ../shared/data/wikitext-2/train.txt --validation_file ../shared/data/wikitext-2/valid.txt
    python -m twotower.training.train --recipe tiny_probe --output_dir outputs/tiny-probe \
        --pretrained_model outputs/tiny/model \
        --train_file ../shared/data/wikitext-2/train.txt --validation_file ../shared/data/wikitext-2/valid.txt

Two CPU processes (gloo): the data is sharded, so halve the per-device batch to keep the global batch:
    torchrun --nproc_per_node 2 -m twotower.training.train --recipe tiny --cpu --per_device_train_batch_size 8 ...

One node with 8 GPUs (DDP; accelerate_configs/fsdp.yaml and deepspeed_zero2.yaml are the alternatives):
    accelerate launch --config_file training/accelerate_configs/ddp.yaml --num_processes 8 \
        -m twotower.training.train --recipe base --output_dir outputs/base

Two nodes with 8 GPUs each: run on both machines, --machine_rank 0 on the first (whose address is
--main_process_ip) and 1 on the second; output_dir must be on a file system both see:
    accelerate launch --config_file training/accelerate_configs/ddp.yaml --num_machines 2 --num_processes 16 \
        --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 \
        -m twotower.training.train --recipe base --output_dir /shared/outputs/base
"""

import argparse
import contextlib
import math
import shutil
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration
from tqdm.auto import tqdm
from transformers import get_scheduler, set_seed

from .arguments import TwoTowerTrainingConfig, load_config
from .checkpointing import (
    FINAL_MODEL_DIR,
    is_finished,
    load_checkpoint,
    read_progress,
    save_checkpoint,
    save_final_model,
)
from .collective import on_main_process
from .data import load_raw_datasets, make_dataloaders, split_blocks, tokenize_and_group
from .early_stopping import EarlyStopping, monitored_loss
from .folder_lock import locked_output_dir
from .hub import check_hub_token, push_to_hub
from .linear_probes import check_linear_probes_fit, lbfgs_step
from .objectives import SeededMaskingCollator, make_collators, prediction_targets
from .phases import (
    build_model,
    clip_gradients,
    final_model_and_state_dict,
    make_loss_function,
    make_optimizer,
    probe_runs,
    resolve_model_config,
    resolve_objective,
    trained_module,
    trained_state_dict,
)
from .probe_cache import (
    CACHE_DIR,
    batch_positions,
    cache_both_splits,
    process_counts,
    replica_orders,
    step_positions,
)
from .run_folder import RUNS_DIR, check_free_space, run_disk_bytes, start_or_resume
from .throughput import flops_per_token, resolve_peak_flops, throughput_metrics
from .tokenizer import build_tokenizer
from .validation import evaluate, evaluate_cached, format_metrics


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


def accumulation_windows(batches, size: int):
    """Group micro-batches into lists of `size` (the last may be shorter): one list per optimizer step."""
    window = []
    for batch in batches:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def count_targets(batch: dict, objective: str) -> torch.Tensor:
    """Target tokens of a batch: its labelled positions (blocks), or the positions each probe reads (cached)."""
    if "targets" in batch:  # [probes, n] cached positions, every one a target
        return torch.tensor(batch["targets"].shape[1], device=batch["targets"].device)
    return prediction_targets(batch["labels"], objective).ne(-100).sum()


def train_step(accelerator, trained, window, loss_function, optimizer, lr_scheduler, max_grad_norm, objective):
    """
    Forward/backward over one accumulation window, clip, step; returns (global token-mean loss, grad norm, global
    count of target tokens).
    """
    # Weigh every target token of the global batch equally: count them over the window and all processes.
    num_items = accelerator.gather(sum(count_targets(batch, objective) for batch in window)).sum()
    step_loss = 0.0
    for index, batch in enumerate(window):
        is_last = index == len(window) - 1
        with contextlib.nullcontext() if is_last else accelerator.no_sync(trained), accelerator.autocast():
            loss = loss_function(batch, num_items)
            # `loss` is already this micro-batch's share of the global token mean: undo accelerate's division
            # by the accumulation steps and DDP's mean over processes.
            accelerator.backward(loss * accelerator.gradient_accumulation_steps * accelerator.num_processes)
        step_loss += loss.detach()
    grad_norm = clip_gradients(accelerator, trained, max_grad_norm) if max_grad_norm > 0 else None
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
    return accelerator.reduce(step_loss, "sum").item(), grad_norm, num_items.item()


def finished_run(accelerator, config: TwoTowerTrainingConfig, checkpoint: Path) -> dict:
    """Resuming a finished run: say there is nothing to do, and return what training_function returns."""
    completed_steps = read_progress(checkpoint)["completed_steps"]
    model_dir = Path(config.output_dir) / FINAL_MODEL_DIR
    accelerator.print(
        f"Nothing to do: the run has finished ({model_dir} is saved and {checkpoint} is at its last step, "
        f"{completed_steps}). To train further, raise --max_train_steps with --allow_config_change; to start over, "
        f"pass --overwrite_output_dir instead of --resume_from_checkpoint."
    )
    return {"model_dir": str(model_dir), "train_losses": [], "eval_metrics": None, "completed_steps": completed_steps,
            "best_step": None, "stopped_early": False}


def training_function(config: TwoTowerTrainingConfig) -> dict:
    """
    Run one phase; returns {"model_dir", "train_losses" (one per optimizer step), "eval_metrics" (of the saved
    weights), "completed_steps", "best_step" (the saved evaluation's, None without early stopping), "stopped_early"}.
    Resuming a run that has already finished does nothing (no train losses, eval_metrics None).
    """
    # Check what can fail fast, before any long work
    model_config = resolve_model_config(config)
    objective = resolve_objective(config, model_config)
    if config.push_to_hub:
        check_hub_token()

    # Initialize the accelerator; the seedable sampler makes the data order a function of (seed, epoch)
    accelerator = Accelerator(
        cpu=config.cpu,
        mixed_precision=config.mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=None if config.report_to == "none" else config.report_to.split(","),
        project_config=ProjectConfiguration(
            project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / RUNS_DIR)
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        dynamo_backend="inductor" if config.torch_compile else None,
    )
    # One run per output folder, locked for the run's lifetime: a new run on an empty slate, a resumed one from a
    # verified checkpoint taken with the same options
    with locked_output_dir(accelerator, config.output_dir):
        resume_checkpoint = on_main_process(accelerator, lambda: start_or_resume(config, accelerator.num_processes))
        if resume_checkpoint is not None and is_finished(resume_checkpoint, config):
            return finished_run(accelerator, config, resume_checkpoint)
        return train_phase(config, accelerator, model_config, objective, resume_checkpoint)


def train_phase(config: TwoTowerTrainingConfig, accelerator, model_config, objective: str, resume_checkpoint) -> dict:
    """training_function's work in its locked output folder: data, model, resume, train, evaluate, save, push."""
    is_probe, is_linear = config.phase == "probe", config.phase == "probe" and config.probe_type == "linear"
    if is_linear:
        check_linear_probes_fit(accelerator)
    set_seed(config.seed)  # before the model is built, so that the seed also controls the new weights

    # Data, model, optimizer: the whole model trains in pretraining, only the probes in the probe phase
    tokenizer, lm_datasets, collators = get_datasets(
        config, accelerator, objective, model_config.tower_type, resume_checkpoint
    )
    model = build_model(config, model_config, tokenizer, objective)
    trained = trained_module(config, model, accelerator.device)
    optimizer = make_optimizer(config, trained)
    checkpoint_bytes, model_bytes = run_disk_bytes(model, trained, optimizer)
    on_main_process(accelerator, lambda: check_free_space(
        config.output_dir, checkpoint_bytes, model_bytes, config.checkpoints_total_limit
    ))

    # Steps per epoch. Pretraining steps over windows of blocks (accelerate shards the batches and steps the
    # scheduler once per process, hence the factors; an accelerate config may set the accumulation steps: the
    # accelerator's value is the one in force). The probe phase runs the frozen towers once and steps over the
    # cached positions of this process's blocks: batches of positions (mlp), or the full batch (linear, L-BFGS).
    accumulation_steps = accelerator.gradient_accumulation_steps
    eval_chunk = config.per_device_eval_batch_size * config.block_size  # cached positions per chunk, as in a batch
    if is_probe:
        caches = cache_both_splits(accelerator, model, lm_datasets, collators, objective, config)
        steps_per_epoch = 1  # linear: an L-BFGS iteration reads the full batch
        if not is_linear:
            positions_per_step = batch_positions(accelerator, caches["train"], config)
            # every process takes the same number of steps; the last of an epoch takes what its share has left
            steps_per_epoch = math.ceil(min(process_counts(accelerator, len(caches["train"]))) / positions_per_step)
        units_per_epoch = steps_per_epoch
    else:
        train_dataloader, eval_dataloader = make_dataloaders(
            lm_datasets, config.per_device_train_batch_size, config.per_device_eval_batch_size, *collators
        )
        units_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes)  # batches of this process
        steps_per_epoch = math.ceil(units_per_epoch / accumulation_steps)
    max_train_steps = config.max_train_steps or config.num_train_epochs * steps_per_epoch
    num_epochs = math.ceil(max_train_steps / steps_per_epoch)
    lr_scheduler = get_scheduler(
        "constant" if is_linear else config.lr_scheduler_type,  # L-BFGS sizes its steps by line search, at lr 1
        optimizer=optimizer,
        num_warmup_steps=config.num_warmup_steps * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )

    # Prepare everything (in the probe phase the frozen backbone stays outside, unwrapped)
    if is_probe:
        trained, optimizer, lr_scheduler = accelerator.prepare(trained, optimizer, lr_scheduler)
    else:
        trained, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
            trained, optimizer, train_dataloader, eval_dataloader, lr_scheduler
        )
    loss_function = make_loss_function(config, trained)

    # Trackers and throughput accounting
    accelerator.init_trackers(config.phase, config=vars(config))
    train_flops_per_token = flops_per_token(model.config, config.block_size, config.phase)
    matmul_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision, torch.float32)
    peak_flops, peak_source = resolve_peak_flops(accelerator.device, matmul_dtype, config.peak_tflops)
    accelerator.print(f"MFU peak: {peak_flops / 1e12:.3g} TFLOP/s per device ({peak_source})")
    tokens_per_batch = config.per_device_train_batch_size * config.block_size * accelerator.num_processes

    # Resume: weights, optimizer, scheduler and RNG states, and the position in the data
    completed_steps, starting_epoch, units_to_skip = 0, 0, 0
    if resume_checkpoint is not None:
        progress = load_checkpoint(accelerator, resume_checkpoint, steps_per_epoch)
        completed_steps, starting_epoch = progress["completed_steps"], progress["epoch"]
        units_to_skip = progress["batches_into_epoch"]
        accelerator.print(f"Resumed from {resume_checkpoint} at step {completed_steps}")

    def checkpoint(name: str, epoch: int, units_into_epoch: int):
        progress = dict(completed_steps=completed_steps, epoch=epoch, batches_into_epoch=units_into_epoch,
                        steps_per_epoch=steps_per_epoch)
        save_checkpoint(accelerator, name, progress, tokenizer, config, config.checkpoints_total_limit)

    def epoch_windows(epoch: int, units_to_skip: int):
        """The optimizer steps of `epoch` after the first `units_to_skip` (batches, or probe steps) already taken."""
        if is_linear:
            if not units_to_skip:  # an epoch is one step: the full batch
                yield [caches["train"]]
        elif is_probe:
            orders = replica_orders(config.seed, epoch, config.probe_replicas, len(caches["train"]))
            for step in range(units_to_skip, steps_per_epoch):
                yield [caches["train"].replica_batch(step_positions(orders, step, steps_per_epoch, positions_per_step))]
        else:
            train_dataloader.set_epoch(epoch)
            if isinstance(train_dataloader.collate_fn, SeededMaskingCollator):
                # new masks every epoch, a function of (seed, epoch, block)
                train_dataloader.collate_fn.set_epoch(epoch)
            batches = train_dataloader
            if units_to_skip:  # resuming mid-epoch: the same order (seed, epoch) minus the batches already seen
                batches = accelerator.skip_first_batches(train_dataloader, units_to_skip)
            yield from accumulation_windows(batches, accumulation_steps)

    def step(window) -> tuple[float, float | None, int]:
        """One optimizer step: (loss, gradient norm, tokens or positions it trained on)."""
        if is_linear:
            return lbfgs_step(accelerator, trained, window[0], optimizer, lr_scheduler, config.probe_l2, eval_chunk)
        loss, grad_norm, num_items = train_step(
            accelerator, trained, window, loss_function, optimizer, lr_scheduler, config.max_grad_norm, objective
        )
        return loss, grad_norm, num_items if is_probe else len(window) * tokens_per_batch

    # Early stopping keeps the best evaluation's weights on CPU; its count restarts when a run resumes
    early_stopping = None
    if config.early_stopping_patience is not None:
        early_stopping = EarlyStopping(config.early_stopping_patience, config.early_stopping_threshold)

    frozen_joint_metrics = None  # the probe phase's joint model is frozen: evaluated once

    def run_evaluation() -> dict:
        nonlocal frozen_joint_metrics
        if is_probe:
            metrics = evaluate_cached(
                accelerator, model, caches["validation"], eval_chunk, config.probe_chunk_size, frozen_joint_metrics
            )
            frozen_joint_metrics = {name: metrics[name] for name in ("loss", "perplexity")}
        else:
            metrics = evaluate(accelerator, trained, eval_dataloader)
        accelerator.log({f"eval/{name}": value for name, value in metrics.items()}, step=completed_steps)
        accelerator.print(f"step {completed_steps}: validation {format_metrics(metrics)}")
        if early_stopping is not None:
            early_stopping.update(monitored_loss(metrics, config.phase), completed_steps, metrics,
                                  lambda: trained_state_dict(accelerator, trained))
        trained.train()
        return metrics

    # Train
    progress_bar = tqdm(
        total=max_train_steps, initial=completed_steps,
        disable=config.disable_tqdm or not accelerator.is_local_main_process,
    )
    train_losses, interval_losses, interval_tokens, eval_step, stopped_early = [], [], 0, None, False
    converged = False  # linear probes: L-BFGS reached the gradient tolerance, or stopped making progress
    epoch_checkpoints = not is_linear  # an L-BFGS epoch is one iteration: checkpoint every checkpointing_steps only
    interval_start = time.perf_counter()
    trained.train()
    for epoch in range(starting_epoch, num_epochs):
        if completed_steps >= max_train_steps:  # resumed from the last step's checkpoint: only the model to save
            break
        units_into_epoch = units_to_skip
        for window in epoch_windows(epoch, units_to_skip):
            loss, grad_norm, tokens = step(window)
            if is_linear:  # at the tolerance L-BFGS did not move; a loss that did not fall is float32's floor
                converged = grad_norm <= config.probe_tolerance or bool(train_losses) and loss >= train_losses[-1]
            completed_steps += 1
            units_into_epoch += len(window)
            interval_tokens += tokens
            train_losses.append(loss)
            interval_losses.append(loss)
            progress_bar.update(1)

            if completed_steps % config.logging_steps == 0 or completed_steps == max_train_steps or converged:
                logs = {"loss": sum(interval_losses) / len(interval_losses), "lr": lr_scheduler.get_last_lr()[0],
                        "epoch": epoch}
                logs |= throughput_metrics(interval_tokens, time.perf_counter() - interval_start,
                                           train_flops_per_token, peak_flops, accelerator.num_processes)
                if grad_norm is not None:
                    logs["grad_norm"] = float(grad_norm)
                accelerator.log({f"train/{name}": value for name, value in logs.items()}, step=completed_steps)
                progress_bar.set_postfix(loss=f"{logs['loss']:.3f}", lr=f"{logs['lr']:.2e}",
                                         tok_s=f"{logs['tokens_per_s']:.0f}", mfu=f"{logs['mfu']:.1%}")
                interval_losses, interval_tokens, interval_start = [], 0, time.perf_counter()
            if config.eval_steps and completed_steps % config.eval_steps == 0:
                eval_metrics, eval_step = run_evaluation(), completed_steps
            end_of_epoch = units_into_epoch == units_per_epoch
            if config.checkpointing_steps and completed_steps % config.checkpointing_steps == 0 and not (
                end_of_epoch and epoch_checkpoints
            ):
                checkpoint(f"step_{completed_steps}", epoch, units_into_epoch)
            if completed_steps >= max_train_steps or converged:
                break
            if early_stopping is not None and early_stopping.should_stop:
                stopped_early = True
                break
        units_to_skip = 0
        if units_into_epoch == units_per_epoch and epoch_checkpoints:
            checkpoint(f"epoch_{epoch}", epoch + 1, 0)
        if completed_steps >= max_train_steps or stopped_early or converged:
            break
    progress_bar.close()
    if is_linear and train_losses:
        outcome = "converged" if grad_norm <= config.probe_tolerance else "not converged; raise --max_train_steps"
        if converged and grad_norm > config.probe_tolerance:
            outcome = "stopped: the objective no longer falls in float32"
        accelerator.print(f"L-BFGS after {completed_steps} steps, largest gradient entry {grad_norm:.2e} "
                          f"(tolerance {config.probe_tolerance:g}): {outcome}")
    # Evaluate the final weights (with early stopping: keep the best evaluation's), save them (Hub layout,
    # atomically), push
    if eval_step != completed_steps:
        eval_metrics = run_evaluation()
    best_state = None
    if early_stopping is not None and early_stopping.best_step not in (None, completed_steps):
        eval_metrics, best_state = early_stopping.best_metrics, early_stopping.best_state
        reason = f"Step {completed_steps} is not the best evaluation"
        if stopped_early:
            reason = (f"Stopped early at step {completed_steps}: validation loss has not improved for "
                      f"{early_stopping.patience} evaluations")
        accelerator.print(f"{reason}; keeping the weights of step {early_stopping.best_step} "
                          f"(loss {early_stopping.best_loss:.4f})")
    final_model, state_dict = final_model_and_state_dict(accelerator, config, model, trained, best_state)
    if is_probe:  # scoring refuses probes without this record (it travels in config.json)
        kept_step = early_stopping.best_step if best_state is not None else completed_steps
        final_model.config.probe_training_steps = kept_step
    tokenizer.model_max_length = final_model.config.max_position_embeddings  # the saved tokenizer's longest input
    records = {"probe_runs": probe_runs(config, model.config.num_towers)} if is_probe else None
    model_dir = save_final_model(accelerator, final_model, state_dict, tokenizer, config, records)
    if is_probe and accelerator.is_main_process:  # a disk cache is this run's working copy (a resumed run rebuilds it)
        shutil.rmtree(Path(config.output_dir) / CACHE_DIR, ignore_errors=True)
    accelerator.end_training()
    accelerator.print(f"Saved the {config.phase} model to {model_dir}")
    if config.push_to_hub and accelerator.is_main_process:
        url = push_to_hub(model_dir, config.hub_model_id, private=config.hub_private_repo)
        accelerator.print(f"Pushed {model_dir} to {url}")
    return {
        "model_dir": str(model_dir), "train_losses": train_losses, "eval_metrics": eval_metrics,
        "completed_steps": completed_steps, "best_step": early_stopping.best_step if early_stopping else None,
        "stopped_early": stopped_early,
    }


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    recipe_parser = argparse.ArgumentParser(add_help=False)
    recipe_parser.add_argument("--recipe")
    recipe = recipe_parser.parse_known_args(argv)[0].recipe
    return training_function(load_config(recipe, argv))


if __name__ == "__main__":
    from .cli import run

    run(main)
