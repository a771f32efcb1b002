"""
Disk, memory and time of the paper-scale recipes (base, large and their masked variants, pretrain and probe phases)
on 1, 4 and 8 GPUs, printed as the markdown tables of docs/training.md. Every figure is a projection, not a
measurement: time = the model's training FLOPs per token (training/launch/throughput.py, nanoGPT's estimate) x the recipe's
tokens (steps x global batch x block size) / (GPUs x datasheet bf16 peak x an assumed MFU), with perfect scaling
over GPUs; memory from bytes per parameter plus an activation estimate; disk from checkpoint and cache sizes.

    python -m benchmarks.project_scale              # the tables of docs/training.md
    python -m benchmarks.project_scale --mfu 0.40 --train_blocks 2000000
"""

import argparse
from dataclasses import dataclass

import torch

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.probes import PROBE_LOGITS_CHUNK_BYTES
from twotower.training.arguments import read_recipe
from twotower.training.feature_cache.probe_cache import FeatureCachePlan, plan_feature_cache
from twotower.training.launch.throughput import DATASHEET_PEAK_TFLOPS, config_flops_per_token as flops_per_token

# (pretrain recipe, probe recipe) pairs; the global batch is the recipes' 5120 blocks on every number of GPUs
# (gradient accumulation makes up for fewer GPUs), so the per-device micro-batch, and memory, stay the recipe's.
RECIPE_PAIRS = (
    ("base", "base_probe"),
    ("large", "large_probe"),
    ("base_masked", "base_masked_probe"),
    ("large_masked", "large_masked_probe"),
)
PEAKS = dict(DATASHEET_PEAK_TFLOPS)
GPUS = {"A100 80GB SXM": PEAKS["A100"]["bf16"], "H100 SXM": PEAKS["H100"]["bf16"]}  # dense bf16 TFLOP/s
GPU_COUNTS = (1, 4, 8)
RECIPE_GPUS = 8  # the recipes' per_device_train_batch_size x gradient_accumulation_steps reach 5120 on 8 GPUs
ASSUMED_MFU = 0.35  # an assumption: typical of GPT-size models at this width on A100/H100; not yet measured on a GPU
TRAIN_BLOCKS = 900_000  # WikiText-103 in blocks of 128 tokens (~0.9M, the base recipe's header): what the cache holds
MASKED_SHARE = 0.15  # masked LM: share of a block's positions that are predicted, hence trained on and cached
# Bytes per parameter. Training (AdamW, fp32 master weights under autocast): weight, gradient, 2 moments. A checkpoint
# (save_state): the fp32 weights of the whole model plus the 2 moments of the trained ones. The final model: fp32.
TRAINING_BYTES, WEIGHT_BYTES, MOMENT_BYTES = 16, 4, 8
FEATURE_BYTES = {"bf16": 2, "float32": 4}  # a cached feature
GPU_MEMORY_GB = 80  # the device `auto` looks at: one A100/H100 of 80 GB
FREE_DISK_GB = 1000  # the disk `auto` looks at when a recipe sets no probe_cache_max_gb
LOGIT_BYTES = 14  # per logit kept for backward: bf16 logits, their fp32 copy, the saved log-softmax, its gradient
PROBE_HIDDEN_BYTES = 16  # per probe feature kept for backward: dense output, GELU, LayerNorm input and output in fp32
GB = 1e9


@dataclass
class Phase:
    recipe: str
    phase: str  # pretrain | probe
    config: TwoTowerConfig
    objective: str  # causal | masked
    steps: int
    global_batch: int  # blocks per optimizer step
    micro_batch: int  # blocks per device and micro-batch
    block_size: int
    checkpoints_total_limit: int
    feature_cache: str | None  # probe phase: the recipe's probe_feature_cache (memory | disk | none | auto)
    cache_budget_gb: float | None  # probe phase: the recipe's probe_cache_max_gb


def read_phase(recipe: str) -> Phase:
    values = read_recipe(recipe)
    if values.get("phase", "pretrain") == "probe":
        # the probe recipe's pretrained model: the pretrain recipe of its pair
        pretrain = next(first for first, second in RECIPE_PAIRS if second == recipe)
        base = read_phase(pretrain)
        config = TwoTowerConfig.from_preset(
            read_recipe(pretrain)["model_preset"], probe_replicas=values.get("probe_replicas", 1)
        )
        objective = base.objective
    else:
        config = TwoTowerConfig.from_preset(values["model_preset"])
        objective = values.get("objective", "causal")
    micro_batch = values["per_device_train_batch_size"]
    return Phase(
        recipe=recipe,
        phase=values.get("phase", "pretrain"),
        config=config,
        objective=objective,
        steps=values["max_train_steps"],
        global_batch=micro_batch * values.get("gradient_accumulation_steps", 1) * RECIPE_GPUS,
        micro_batch=micro_batch,
        block_size=values.get("block_size", 128),
        checkpoints_total_limit=values.get("checkpoints_total_limit", 2),
        feature_cache=values.get("probe_feature_cache") if values.get("phase") == "probe" else None,
        cache_budget_gb=values.get("probe_cache_max_gb"),
    )


def parameter_counts(phase: Phase) -> tuple[int, int]:
    """(all parameters, trained parameters): the backbone in pretraining, the probes in the probe phase."""
    model_class = TwoTowerForMaskedLM if phase.objective == "masked" else TwoTowerForCausalLM
    with torch.device("meta"):  # shapes only, no memory
        model = model_class(phase.config)
    total = sum(parameter.numel() for parameter in model.parameters())
    probes = sum(parameter.numel() for name, parameter in model.named_parameters() if name.startswith("probes."))
    return total, probes if phase.phase == "probe" else total - probes


def predicted_positions(phase: Phase) -> float:
    """Positions per block that are predicted: all but the last (causal), or the masked share (masked)."""
    return MASKED_SHARE * phase.block_size if phase.objective == "masked" else phase.block_size - 1


def forward_flops_per_token(config: TwoTowerConfig, block_size: int) -> float:
    """The frozen towers and fusion in forward only (what caching the features costs): a third of the training
    FLOPs per token, less the decoder's projection onto the vocabulary."""
    return (flops_per_token(config, block_size, "pretrain") - 6 * config.vocab_size * config.embedding_size) / 3


def training_flops(phase: Phase, recompute: bool = False) -> dict:
    """{"per_token", "tokens", "total"}: pretraining counts tokens; the probe phase counts trained positions, plus
    one forward pass over TRAIN_BLOCKS to cache the features, or with `recompute` a forward pass at every step."""
    config, blocks = phase.config, phase.steps * phase.global_batch
    if phase.phase == "pretrain":
        per_token = flops_per_token(config, phase.block_size, "pretrain")
        tokens = blocks * phase.block_size
        return {"per_token": per_token, "tokens": tokens, "total": per_token * tokens}
    per_token = flops_per_token(config, phase.block_size, "probe")
    positions = blocks * predicted_positions(phase)
    towers_blocks = blocks if recompute else TRAIN_BLOCKS
    towers = forward_flops_per_token(config, phase.block_size) * towers_blocks * phase.block_size
    return {"per_token": per_token, "tokens": positions, "total": per_token * positions + towers}


def hours(total_flops: float, peak_tflops: float, gpus: int, mfu: float) -> float:
    return total_flops / (gpus * peak_tflops * 1e12 * mfu) / 3600


def duration(hours: float) -> str:
    return f"{hours:.1f} h" if hours >= 1 else f"{hours * 60:.0f} min"


def activation_bytes(phase: Phase) -> float:
    """
    Activations of one micro-batch kept for backward, Korthikanti et al. (2022)'s estimate for 16-bit activations:
    per transformer layer seq x batch x width x (34 + 5 x heads x seq / width) bytes, summed over every tower's
    layers, plus the [batch, seq, vocab] logits (LOGIT_BYTES each). SDPA's fused kernels drop the 5 x heads term.
    """
    config, seq, batch = phase.config, phase.block_size, phase.micro_batch
    width, heads = config.hidden_size, config.num_attention_heads
    per_layer = seq * batch * width * (34 + 5 * heads * seq / width)
    return config.num_towers * config.num_hidden_layers * per_layer + batch * seq * config.vocab_size * LOGIT_BYTES


def cache_bytes(phase: Phase, feature_bytes: int) -> float:
    """The probe phase's feature cache over TRAIN_BLOCKS: towers x hidden features per predicted position."""
    config = phase.config
    return TRAIN_BLOCKS * predicted_positions(phase) * config.num_towers * config.hidden_size * feature_bytes


def cache_choice(phase: Phase) -> FeatureCachePlan:
    """What the probe phase's `probe_feature_cache` decides on one GPU of GPU_MEMORY_GB, by the package's own rule."""
    return plan_feature_cache(
        phase.feature_cache, "mlp", phase.config.num_towers, phase.config.hidden_size, torch.bfloat16,
        train_positions=round(TRAIN_BLOCKS * predicted_positions(phase)), validation_positions=0,
        free_memory_bytes=GPU_MEMORY_GB * GB, free_disk_bytes=FREE_DISK_GB * GB, probe_cache_max_gb=phase.cache_budget_gb,
    )  # fmt: skip


def memory_and_disk(phase: Phase) -> dict:
    """Bytes per device (training states, activations, an in-memory cache's share per GPU count) and on disk."""
    total, trained = parameter_counts(phase)
    frozen = total - trained
    if phase.phase == "pretrain":
        activations = activation_bytes(phase)
    else:  # the probes' hidden states (PROBE_HIDDEN_BYTES a feature) and 3 chunks of logits (logits, softmax, gradient)
        positions = phase.micro_batch * predicted_positions(phase)
        hidden = positions * phase.config.num_probes * phase.config.hidden_size * PROBE_HIDDEN_BYTES
        activations = hidden + 3 * PROBE_LOGITS_CHUNK_BYTES
    states = trained * TRAINING_BYTES + frozen * WEIGHT_BYTES
    checkpoint = total * WEIGHT_BYTES + trained * MOMENT_BYTES
    caches = {name: cache_bytes(phase, size) for name, size in FEATURE_BYTES.items()} if phase.feature_cache else {}
    in_memory = phase.feature_cache is not None and cache_choice(phase).choice == "memory"
    return {
        "parameters": total,
        "trained": trained,
        "per_device": {gpus: states + activations + (caches["bf16"] / gpus if in_memory else 0) for gpus in GPU_COUNTS},
        "states": states,
        "activations": activations,
        # the disk check wants room for one checkpoint more than the limit, and the final model beside them
        "checkpoints": (phase.checkpoints_total_limit + 1) * checkpoint,
        "model": total * WEIGHT_BYTES,
        "caches": caches,
    }


def time_table(mfu: float) -> str:
    gpu_columns = [f"{name} x{gpus}" for name in GPUS for gpus in GPU_COUNTS]
    lines = [
        "| recipe | phase | FLOPs per token | tokens (probe: positions) | FLOPs | " + " | ".join(gpu_columns) + " |",
        "|---" * (5 + len(gpu_columns)) + "|",
    ]
    for pair in RECIPE_PAIRS:
        for recipe in pair:
            phase = read_phase(recipe)
            variants = [("pretrain", False)]
            if phase.phase == "probe":
                variants = [("probe, cached", False), ("probe, recomputed", True)]
            for label, recompute in variants:
                flops = training_flops(phase, recompute)
                times = [
                    duration(hours(flops["total"], peak, gpus, mfu)) for peak in GPUS.values() for gpus in GPU_COUNTS
                ]
                lines.append(
                    f"| `{recipe}` | {label} | {flops['per_token'] / 1e6:,.0f} M | {flops['tokens']:.3g} | "
                    f"{flops['total']:.3g} | " + " | ".join(times) + " |"
                )
    return "\n".join(lines)


def memory_table() -> str:
    lines = [
        "| recipe | phase | parameters (trained) | training states | activations (micro-batch) | memory per device, "
        "1 / 4 / 8 GPUs | checkpoints (limit + 1) | final model | feature cache, bf16 / float32 |",
        "|---" * 9 + "|",
    ]
    for pair in RECIPE_PAIRS:
        for recipe in pair:
            phase = read_phase(recipe)
            figures = memory_and_disk(phase)
            per_device = " / ".join(f"{figures['per_device'][gpus] / GB:.1f}" for gpus in GPU_COUNTS)
            caches = figures["caches"]
            cache = "none"
            if caches:
                choice = cache_choice(phase).choice
                cache = f"{caches['bf16'] / GB:,.0f} / {caches['float32'] / GB:,.0f} GB ({phase.feature_cache}: {choice})"
            lines.append(
                f"| `{recipe}` | {phase.phase} | "
                f"{figures['parameters'] / 1e6:.1f} M ({figures['trained'] / 1e6:.1f} M) | "
                f"{figures['states'] / GB:.1f} GB | {figures['activations'] / GB:.1f} GB ({phase.micro_batch}) | "
                f"{per_device} GB | {figures['checkpoints'] / GB:.1f} GB | {figures['model'] / GB:.2f} GB | {cache} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    global TRAIN_BLOCKS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mfu", type=float, default=ASSUMED_MFU, help="assumed model FLOPs utilization (0-1]")
    parser.add_argument("--train_blocks", type=int, default=TRAIN_BLOCKS, help="training blocks the probe cache holds")
    args = parser.parse_args(argv)
    if not 0 < args.mfu <= 1:
        parser.error(f"--mfu must be in (0, 1], got {args.mfu}")
    TRAIN_BLOCKS = args.train_blocks
    text = (
        f"Time (projection: MFU {args.mfu:.0%} assumed, bf16 dense datasheet peaks "
        + ", ".join(f"{name} {peak:g} TFLOP/s" for name, peak in GPUS.items())
        + ", perfect scaling over GPUs)\n\n"
        + time_table(args.mfu)
        + "\n\nMemory and disk (projection)\n\n"
        + memory_table()
    )
    print(text)
    return text


if __name__ == "__main__":
    main()
