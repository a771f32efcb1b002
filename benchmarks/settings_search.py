"""
The fastest-setting search of "$100K or 100 Days" (Khandelwal et al. 2024), for the two-tower model: for each
setting that applies on this machine, the largest power-of-two micro-batch that fits, then a few timed steps.
"""

import itertools
import math
import time
from dataclasses import dataclass, replace

import torch
from accelerate.commands.config.config_args import ClusterConfig

from modeling_twotower import TwoTowerConfig

from .baselines import TWO_TOWER, build_model
from .measure import release_memory, synchronize
from .workloads import Setting, TrainingStep, measure, random_ids, why_unsupported

PRUNE_FACTOR = 3.0  # drop a setting whose step takes this many times the fastest one at the same micro-batch
ACCELERATE_MIXED_PRECISION = {"fp32": "no", "tf32": "no", "bf16": "bf16", "fp16": "fp16"}


@dataclass
class SearchRow:
    setting: Setting
    status: str  # "ok", or why the setting was skipped, pruned or failed
    micro_batch: int | None = None
    tokens_per_s: float | None = None
    step_s: float | None = None
    peak_memory_bytes: int | None = None
    mfu: float | None = None  # filled in once the run's peak FLOP/s is known


def fastest(rows: list[SearchRow]) -> SearchRow | None:
    """The measured row with the most tokens/s."""
    return max((row for row in rows if row.status == "ok"), key=lambda row: row.tokens_per_s, default=None)


def candidate_settings(
    precisions: list[str], attn_implementations: list[str], compile_modes: list[str], checkpointing: list[bool]
) -> list[Setting]:
    """Every combination of the given values: the full grid."""
    grid = itertools.product(precisions, attn_implementations, compile_modes, checkpointing)
    return [Setting(*values) for values in grid]


def one_at_a_time(
    precisions: list[str], attn_implementations: list[str], compile_modes: list[str], checkpointing: list[bool]
) -> list[Setting]:
    """The first value of every axis, then each other value alone (the quick search; the grid grows as a product)."""
    baseline = Setting(precisions[0], attn_implementations[0], compile_modes[0], checkpointing[0])
    settings = [baseline]
    axes = {
        "precision": precisions,
        "attn_implementation": attn_implementations,
        "compile": compile_modes,
        "activation_checkpointing": checkpointing,
    }
    for field, values in axes.items():
        settings += [replace(baseline, **{field: value}) for value in values[1:]]
    return settings


def best_combination(rows: list[SearchRow], baseline: Setting) -> Setting:
    """Each axis set to the value that beat the baseline most when changed alone."""
    baseline_rate = next(row.tokens_per_s for row in rows if row.setting == baseline)
    combined = baseline
    for field in ("precision", "attn_implementation", "compile", "activation_checkpointing"):
        changed = [
            row
            for row in rows
            if row.status == "ok" and getattr(row.setting, field) != getattr(baseline, field)
            and replace(row.setting, **{field: getattr(baseline, field)}) == baseline
        ]
        winner = max(changed, key=lambda row: row.tokens_per_s, default=None)
        if winner is not None and winner.tokens_per_s > baseline_rate:
            combined = replace(combined, **{field: getattr(winner.setting, field)})
    return combined


def fits(config, setting, device, micro_batch, seq_len, memory_budget_bytes) -> tuple[bool, float]:
    """Whether one training step at `micro_batch` fits (no out-of-memory, under the budget), and its seconds."""
    input_ids = random_ids(config.vocab_size, micro_batch, seq_len, device)
    step = TrainingStep(build_model(TWO_TOWER, config), setting, device, input_ids)
    try:
        synchronize(device)
        start = time.perf_counter()
        peak = step.peak_memory()
        seconds = time.perf_counter() - start
    except torch.OutOfMemoryError:
        return False, math.inf
    finally:
        del step
        release_memory(device)
    return memory_budget_bytes is None or peak <= memory_budget_bytes, seconds


def largest_micro_batch(
    config, setting, device, seq_len, max_micro_batch, memory_budget_bytes, fastest_seconds: dict[int, float]
) -> tuple[int | None, str | None, dict[int, float]]:
    """
    The largest power of two <= `max_micro_batch` whose step fits, by doubling from 1, uncompiled (inductor never
    needs more memory than eager). Gives up when a step takes PRUNE_FACTOR times the fastest step of another
    setting at the same micro-batch (`fastest_seconds`). Returns (micro_batch, why there is none, the seconds of
    each step tried, by micro-batch).
    """
    eager = replace(setting, compile="none")
    best, micro_batch, seconds_by_batch = None, 1, {}
    while micro_batch <= max_micro_batch:
        fitting, seconds = fits(config, eager, device, micro_batch, seq_len, memory_budget_bytes)
        if not fitting:
            break
        seconds_by_batch[micro_batch] = seconds
        if seconds > PRUNE_FACTOR * fastest_seconds.get(micro_batch, math.inf):
            ratio = seconds / fastest_seconds[micro_batch]
            return None, f"pruned: a step at micro-batch {micro_batch} took {ratio:.1f}x the fastest", seconds_by_batch
        best = micro_batch
        micro_batch *= 2
    return best, None if best is not None else "does not fit even one sequence", seconds_by_batch


def search_fastest_setting(
    config: TwoTowerConfig,
    device: torch.device,
    settings: list[Setting],
    seq_len: int,
    max_micro_batch: int,
    memory_budget_bytes: int | None,
    warmup: int,
    repeats: int,
    each_round=None,
    log=print,
) -> list[SearchRow]:
    """Time every setting in `settings` at its largest fitting micro-batch; unsupported ones are skipped."""
    rows = []
    micro_batches = {}  # memory does not depend on compilation: one search per (precision, attention, checkpointing)
    fastest_seconds = {}  # the fastest step seen at each micro-batch, for pruning
    for setting in settings:
        reason = why_unsupported(setting, device)
        if reason is not None:
            rows.append(SearchRow(setting, f"skipped: {reason}"))
            log(f"  {setting}: skipped ({reason})")
            continue
        memory_key = replace(setting, compile="none")
        if memory_key not in micro_batches:
            micro_batches[memory_key] = largest_micro_batch(
                config, setting, device, seq_len, max_micro_batch, memory_budget_bytes, fastest_seconds
            )
            for micro_batch, seconds in micro_batches[memory_key][2].items():
                fastest_seconds[micro_batch] = min(seconds, fastest_seconds.get(micro_batch, math.inf))
        micro_batch, why_not, _ = micro_batches[memory_key]
        if micro_batch is None:
            rows.append(SearchRow(setting, why_not))
            log(f"  {setting}: {why_not}")
            continue
        input_ids = random_ids(config.vocab_size, micro_batch, seq_len, device)
        step = None
        try:
            step = TrainingStep(build_model(TWO_TOWER, config), setting, device, input_ids)
            measurement = measure({"train": step}, device, warmup, repeats, each_round=each_round)["train"]
        except Exception as error:  # a setting that crashes (a compiler error, say) is reported, not fatal
            rows.append(SearchRow(setting, f"failed: {type(error).__name__}: {str(error).splitlines()[0][:120]}"))
            log(f"  {setting}: {rows[-1].status}")
            continue
        finally:
            del step  # the model, its gradients and optimizer state go before the next setting's
            release_memory(device)
        figures = (measurement.tokens_per_s, measurement.call_s, measurement.peak_memory_bytes)
        rows.append(SearchRow(setting, "ok", micro_batch, *figures))
        log(f"  {setting}: micro-batch {micro_batch}, {measurement.tokens_per_s:,.0f} tokens/s")
    return rows


def accelerate_config(setting: Setting, device: torch.device, num_processes: int = 1) -> dict:
    """The Accelerate config file (`accelerate launch --config_file`) for `setting`, checked by Accelerate itself."""
    config = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "NO" if num_processes == 1 else "MULTI_GPU",
        "mixed_precision": ACCELERATE_MIXED_PRECISION[setting.precision],
        "num_machines": 1,
        "num_processes": num_processes,
        "use_cpu": device.type == "cpu",
    }
    if setting.compile != "none":
        config["dynamo_config"] = {
            "dynamo_backend": "INDUCTOR",
            "dynamo_mode": "default",
            "dynamo_use_fullgraph": False,
            "dynamo_use_dynamic": False,
            "dynamo_use_regional_compilation": setting.compile == "regional",
        }
    ClusterConfig(**{"debug": False, **config})  # raises on a key or value Accelerate does not know
    return config


def training_arguments(row: SearchRow, global_batch_size: int, num_processes: int = 1) -> list[str]:
    """`twotower.training.train` options that reproduce the fastest row at the recipe's global batch."""
    per_step = row.micro_batch * num_processes
    arguments = [
        "--per_device_train_batch_size", str(row.micro_batch),
        "--gradient_accumulation_steps", str(max(1, math.ceil(global_batch_size / per_step))),
        # the recipe's mixed_precision would override the Accelerate config's
        "--mixed_precision", ACCELERATE_MIXED_PRECISION[row.setting.precision],
    ]  # fmt: skip
    if row.setting.activation_checkpointing:
        arguments += ["--gradient_checkpointing", "true"]
    return arguments


def launch_notes(setting: Setting) -> list[str]:
    """What the printed config and arguments cannot carry, and how to get it."""
    notes = []
    if setting.precision == "tf32":
        notes.append("TF32: prefix the launch with TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 (the training has no option)")
    if setting.attn_implementation != "sdpa":
        notes.append(
            f"attention: the training builds models with SDPA; {setting.attn_implementation} won here, set "
            f"`attn_implementation` in the model config to use it"
        )
    return notes
