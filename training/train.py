"""
Train a two-tower language model (He & Toyoizumi 2022) with Accelerate, from raw text to a saved model.

Phase `pretrain` (the paper's phase 1) trains the joint model; phase `probe` (phases 2 and 3) freezes it, runs its
towers once over the data and trains `--probe_replicas` probes per tower on the cached features. Options come from
a recipe (training/recipes/*.yaml) overridden by `--key value`; `--help` lists them all. A run writes
OUTPUT_DIR/model (the final model in the Hub layout), OUTPUT_DIR/checkpoints and OUTPUT_DIR/runs (TensorBoard).

One CPU, the tiny recipe (minutes):
    python -m twotower.training.train --recipe tiny --output_dir outputs/tiny/pretrain \
        --train_file ../shared/data/wikitext-2/train.txt --validation_file ../shared/data/wikitext-2/valid.txt
    python -m twotower.training.train --recipe tiny_probe --output_dir outputs/tiny/probe \
        --pretrained_model outputs/tiny/pretrain/model \
        --train_file ../shared/data/wikitext-2/train.txt --validation_file ../shared/data/wikitext-2/valid.txt

Two CPU processes (gloo): the data is sharded, so halve the per-device batch to keep the global batch:
    torchrun --nproc_per_node 2 -m twotower.training.train --recipe tiny --cpu --per_device_train_batch_size 8 ...

One node with 8 GPUs (DDP; accelerate_configs/fsdp.yaml and deepspeed_zero2.yaml are the alternatives). The configs
train in bf16 and the base recipes say fp16 (the reference's): a disagreement is refused, so say which to use:
    accelerate launch --config_file training/accelerate_configs/ddp.yaml --num_processes 8 \
        -m twotower.training.train --recipe base --mixed_precision bf16 --output_dir outputs/base/pretrain

The same config on 2 CPU processes (accelerate launch's own --cpu would start one process; the training's starts gloo):
    accelerate launch --config_file training/accelerate_configs/ddp.yaml --num_processes 2 \
        -m twotower.training.train --recipe tiny --cpu true ...

Two nodes with 8 GPUs each: run on both machines, --machine_rank 0 on the first (whose address is
--main_process_ip) and 1 on the second; output_dir must be on a file system both see:
    accelerate launch --config_file training/accelerate_configs/ddp.yaml --num_machines 2 --num_processes 16 \
        --machine_rank 0 --main_process_ip 10.0.0.1 --main_process_port 29500 \
        -m twotower.training.train --recipe base --mixed_precision bf16 --output_dir /shared/outputs/base
"""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import ProjectConfiguration
from tqdm.auto import tqdm

from .arguments import TwoTowerTrainingConfig, load_config
from .checkpoints.checkpointing import FINAL_MODEL_DIR, is_finished, read_progress, save_checkpoint, save_final_model
from .launch.compilation import draw_random_eagerly_on_cpu
from .utils.cli import CommandParser, run
from .utils.collective import end_processes, on_main_process
from .run.early_stopping import EarlyStopping
from .hub import check_hub_target, push_to_hub
from .launch.launch_checks import check_launch, resolve_mixed_precision
from .launch.library_notices import quiet_inapplicable_notices
from .phases import make_phase, trained_state_dict
from .run.run_folder import EVAL_HISTORY, RUNS_DIR, locked_output_dir, start_or_resume
from .run.run_setup import TrainingRun, prepare_run
from .launch.throughput import throughput_metrics
from .data.tokenizer import check_named_tokenizer
from .phases.validation import format_metrics


def save_progress(run: TrainingRun, name: str, completed_steps: int, epoch: int, units_into_epoch: int) -> None:
    """A resumable checkpoint `name`: the accelerator's state and where the loop is in the data."""
    progress = dict(completed_steps=completed_steps, epoch=epoch, batches_into_epoch=units_into_epoch,
                    steps_per_epoch=run.steps_per_epoch)
    save_checkpoint(run.accelerator, name, progress, run.tokenizer, run.config, run.config.checkpoints_total_limit)


class TrainLog:
    """The progress bar, and every logging_steps the train/ metrics: mean loss, lr, throughput, MFU, grad norm."""

    def __init__(self, run: TrainingRun, completed_steps: int):
        self.run = run
        self.progress_bar = tqdm(
            total=run.max_train_steps, initial=completed_steps,
            disable=run.config.disable_tqdm or not run.accelerator.is_local_main_process,
        )
        self.losses, self.tokens, self.start = [], 0, time.perf_counter()

    def add(self, loss: float, tokens: int) -> None:
        self.losses.append(loss)
        self.tokens += tokens
        self.progress_bar.update(1)

    def write(self, step: int, epoch: int, grad_norm) -> None:
        """Log the interval since the last write, and start a new one."""
        run = self.run
        logs = {"loss": sum(self.losses) / len(self.losses), "lr": run.lr_scheduler.get_last_lr()[0], "epoch": epoch}
        logs |= throughput_metrics(self.tokens, time.perf_counter() - self.start, run.train_flops_per_token,
                                   run.peak_flops, run.accelerator.num_processes)
        if grad_norm is not None:
            logs["grad_norm"] = float(grad_norm)
        run.accelerator.log({f"train/{name}": value for name, value in logs.items()}, step=step)
        # the probe phase's loss sums its probes' (they train as one); the bar shows the mean per probe
        probes = run.model.config.num_towers * run.model.config.probe_replicas if run.config.phase == "probe" else 1
        self.progress_bar.set_postfix(loss=f"{logs['loss'] / probes:.3f}", lr=f"{logs['lr']:.2e}",
                                      tok_s=f"{logs['tokens_per_s']:.0f}", mfu=f"{logs['mfu']:.1%}")
        self.losses, self.tokens, self.start = [], 0, time.perf_counter()

    def close(self) -> None:
        self.progress_bar.close()


class Evaluator:
    """
    Evaluates the trained weights, logs the metrics and feeds early stopping, which keeps the best evaluation's
    weights on CPU (its count restarts when a run resumes).
    """

    def __init__(self, run: TrainingRun):
        self.run = run
        self.early_stopping = None
        if run.config.early_stopping_patience is not None:
            self.early_stopping = EarlyStopping(run.config.early_stopping_patience, run.config.early_stopping_threshold)
        self.last_step = self.last_metrics = None

    def __call__(self, step: int) -> dict:
        run, accelerator = self.run, self.run.accelerator
        metrics = run.phase.evaluate(run)
        accelerator.log({f"eval/{name}": value for name, value in metrics.items()}, step=step)
        accelerator.print(f"step {step}: validation {format_metrics(metrics)}")
        if accelerator.is_main_process:
            self.record(step, metrics)
        if self.early_stopping is not None:
            self.early_stopping.update(run.phase.monitored_loss(metrics), step, metrics,
                                       lambda: trained_state_dict(accelerator, run.trained))
        run.trained.train()
        self.last_step, self.last_metrics = step, metrics
        return metrics

    def record(self, step: int, metrics: dict) -> None:
        """One line of runs/eval_history.jsonl: the evaluation's step and metrics, whatever the trackers (a resumed
        run appends; `read_eval_history` keeps the last line of each step)."""
        history = Path(self.run.config.output_dir) / RUNS_DIR / EVAL_HISTORY
        history.parent.mkdir(parents=True, exist_ok=True)
        with history.open("a") as file:
            file.write(json.dumps({"step": step, **metrics}) + "\n")

    @property
    def should_stop(self) -> bool:
        return self.early_stopping is not None and self.early_stopping.should_stop

    @property
    def best_step(self) -> int | None:
        return self.early_stopping.best_step if self.early_stopping is not None else None


@dataclass
class LoopOutcome:
    """How the loop ended."""

    completed_steps: int
    train_losses: list  # one per optimizer step of this run
    grad_norm: float | None  # the last step's
    stopped_early: bool
    converged: bool  # linear probes: L-BFGS reached the gradient tolerance, or stopped making progress


def train_loop(run: TrainingRun, evaluator: Evaluator) -> LoopOutcome:
    """The optimizer steps, with logging, evaluation, checkpoints and the stopping rules."""
    config = run.config
    completed_steps, units_to_skip, train_losses, grad_norm = run.resumed_steps, run.units_to_skip, [], None
    stopped_early = converged = False
    epoch_checkpoints = run.phase.checkpoints_every_epoch
    checkpoints = bool(config.checkpointing_steps) or epoch_checkpoints  # linear probes without it take none
    log = TrainLog(run, completed_steps)
    run.trained.train()
    for epoch in range(run.starting_epoch, run.num_epochs):
        if completed_steps >= run.max_train_steps:  # resumed from the last step's checkpoint: only the model to save
            break
        units_into_epoch = units_to_skip
        for window in run.phase.epoch_windows(run, epoch, units_to_skip):
            loss, grad_norm, tokens = run.phase.optimizer_step(run, window)
            converged = run.phase.converged(loss, grad_norm, train_losses)
            completed_steps += 1
            units_into_epoch += len(window)
            train_losses.append(loss)
            log.add(loss, tokens)
            if completed_steps % config.logging_steps == 0 or completed_steps == run.max_train_steps or converged:
                log.write(completed_steps, epoch, grad_norm)
            if config.eval_steps and completed_steps % config.eval_steps == 0:
                evaluator(completed_steps)
            end_of_epoch = units_into_epoch == run.units_per_epoch
            on_schedule = config.checkpointing_steps and completed_steps % config.checkpointing_steps == 0
            # The run ends on a checkpoint: a final save that fails (a full disk) resumes without training again
            ends_run = completed_steps >= run.max_train_steps or converged or evaluator.should_stop
            if (on_schedule or ends_run and checkpoints) and not (end_of_epoch and epoch_checkpoints):
                save_progress(run, f"step_{completed_steps}", completed_steps, epoch, units_into_epoch)
            if completed_steps >= run.max_train_steps or converged:
                break
            if evaluator.should_stop:
                stopped_early = True
                break
        units_to_skip = 0
        if units_into_epoch == run.units_per_epoch and epoch_checkpoints:
            save_progress(run, f"epoch_{epoch}", completed_steps, epoch + 1, 0)
        if completed_steps >= run.max_train_steps or stopped_early or converged:
            break
    log.close()
    return LoopOutcome(completed_steps, train_losses, grad_norm, stopped_early, converged)


def kept_weights(run: TrainingRun, evaluator: Evaluator, outcome: LoopOutcome) -> tuple[dict, dict | None]:
    """
    (metrics, state dict) of the weights to save: the final ones (state None: the trained module's), evaluated
    unless the last step was; with early stopping, the best evaluation's.
    """
    if evaluator.last_step != outcome.completed_steps:
        evaluator(outcome.completed_steps)
    early_stopping = evaluator.early_stopping
    if early_stopping is None or early_stopping.best_step in (None, outcome.completed_steps):
        return evaluator.last_metrics, None
    reason = f"Step {outcome.completed_steps} is not the best evaluation"
    if outcome.stopped_early:
        reason = (f"Stopped early at step {outcome.completed_steps}: validation loss has not improved for "
                  f"{early_stopping.patience} evaluations")
    run.accelerator.print(f"{reason}; keeping the weights of step {early_stopping.best_step} "
                          f"(loss {early_stopping.best_loss:.4f})")
    return early_stopping.best_metrics, early_stopping.best_state


def finish_run(run: TrainingRun, evaluator: Evaluator, outcome: LoopOutcome) -> dict:
    """Evaluate, save the kept weights (Hub layout, atomically), push; returns training_function's result."""
    config, accelerator, phase = run.config, run.accelerator, run.phase
    phase.report_end(run, outcome)
    eval_metrics, best_state = kept_weights(run, evaluator, outcome)
    final_model, state_dict = phase.final_model_and_state_dict(accelerator, run.model, run.trained, best_state)
    kept_step = evaluator.best_step if best_state is not None else outcome.completed_steps
    records = phase.records(run, final_model, kept_step)
    run.tokenizer.model_max_length = final_model.config.max_position_embeddings  # the saved tokenizer's longest input
    model_dir = save_final_model(accelerator, final_model, state_dict, run.tokenizer, config, records)
    phase.clean_up(run)
    accelerator.print(f"Saved the {phase.name} model to {model_dir}")
    if config.push_to_hub and accelerator.is_main_process:
        url = push_to_hub(model_dir, config.hub_model_id, private=config.hub_private_repo)
        accelerator.print(f"Pushed {model_dir} to {url}")
    return {
        "model_dir": str(model_dir), "train_losses": outcome.train_losses, "eval_metrics": eval_metrics,
        "completed_steps": outcome.completed_steps, "best_step": evaluator.best_step,
        "stopped_early": outcome.stopped_early,
    }


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
    phase = make_phase(config)
    model_config = phase.resolve_model_config()
    objective = phase.resolve_objective(model_config)
    check_named_tokenizer(config)
    if config.push_to_hub:
        check_hub_target(config.hub_model_id, "--push_to_hub --hub_model_id",
                         "drop --push_to_hub and upload the saved model later with "
                         "`python -m twotower.evaluation.publishing.publish`")
    mixed_precision, precision_source = resolve_mixed_precision(config)

    # Initialize the accelerator; the seedable sampler makes the data order a function of (seed, epoch)
    accelerator = Accelerator(
        cpu=config.cpu,
        mixed_precision=mixed_precision,
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=None if config.report_to == "none" else config.report_to.split(","),
        project_config=ProjectConfiguration(
            project_dir=config.output_dir, logging_dir=str(Path(config.output_dir) / RUNS_DIR)
        ),
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=config.seed),
        dynamo_backend="inductor" if config.torch_compile else None,
    )
    check_launch(accelerator)
    if config.torch_compile:
        draw_random_eagerly_on_cpu(accelerator.device)
    quiet_inapplicable_notices(accelerator)
    phase.check_accelerator(accelerator)
    accelerator.print(f"{accelerator.num_processes} process(es), {accelerator.distributed_type}, mixed precision "
                      f"{accelerator.mixed_precision} (from {precision_source})")
    # One run per output folder, locked for the run's lifetime: a new run on an empty slate, a resumed one from a
    # verified checkpoint taken with the same options
    with locked_output_dir(accelerator, config.output_dir):
        resume_checkpoint = on_main_process(accelerator, lambda: start_or_resume(config, accelerator.num_processes))
        if resume_checkpoint is not None and is_finished(resume_checkpoint, config):
            return finished_run(accelerator, config, resume_checkpoint)
        run = prepare_run(config, phase, accelerator, model_config, objective, resume_checkpoint)
        evaluator = Evaluator(run)
        outcome = train_loop(run, evaluator)
        result = finish_run(run, evaluator, outcome)
        # The prepared (DDP) module holds the process group: it goes first, while the group is still registered
        del run, evaluator, outcome
    end_processes(accelerator)
    return result


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    recipe_parser = CommandParser(add_help=False)
    recipe_parser.add_argument("--recipe")
    recipe = recipe_parser.parse_known_args(argv)[0].recipe
    return training_function(load_config(recipe, argv))


if __name__ == "__main__":
    run(main)
