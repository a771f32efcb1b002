"""
Where a training step's time goes (issue #53): torch.profiler over a few training steps (forward, backward,
gradient clipping, AdamW, as `workloads.TrainingStep` runs them) of the two-tower model and of equal-FLOP GPT-2,
eager and compiled, on one thread. Prints, per model and mode, the self-CPU time of each operator group in ms per
step and as a share of the step.

    python -m benchmarks.profile_step --steps 3 --warmup 1   # tiny, width 128, MLP 512, vocabulary 8192, 16 x 128

Eager ops are grouped by the module that ran them (forward hooks open a profiler range; a backward op takes the
group of the forward op that made its autograd node). Compiled code runs as inductor kernels, grouped by name and
shape: the fusion's LayerNorm counts as a layer norm there, a kernel that fuses a dropout into other work
counts as dropout masks, and the loss's operator with everything it runs counts as the vocabulary projection and loss.
"""

import statistics
import sys
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from transformers import HfArgumentParser

from .baselines import GPT2_EQUAL_FLOPS, TWO_TOWER, build_model
from .bench_speed import BenchmarkArguments, size_config
from .workloads import MAX_GRAD_NORM, Setting, prepare_for_training, random_ids, training_loss_kwargs

GROUPS = (
    "block matmuls", "attention", "layer norms", "fusion", "vocabulary projection + loss", "dropout masks",
    "optimizer step", "copies, permutes", "other",
)
COPY_OPS = ("aten::copy_", "aten::clone", "aten::contiguous", "aten::cat", "aten::_to_copy", "aten::empty_like")
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
OPTIMIZER_RANGE = "group:optimizer step"
LOSS_OPERATOR_SUFFIX = "_loss_and_grads"  # linear_cross_entropy's operator, named after its module
NAME_GROUPS = (  # a fused kernel belongs to the first group one of its op names matches
    (("log_softmax", "nll_loss", "cross_entropy", "gather"), "vocabulary projection + loss"),  # gather: the gold logit
    (("softmax", "scaled_dot_product", "flash_attention"), "attention"),
    (("bernoulli", "native_dropout", "rand"), "dropout masks"),
    (("layer_norm",), "layer norms"),
    (("clone", "permute", "transpose", "cat", "copy"), "copies, permutes"),
)


@dataclass
class ProfileArguments:
    size: str = "tiny"
    hidden_size: int = 128
    intermediate_size: int = 512
    vocab_size: int = 8192
    micro_batch: int = 16
    layout: str | None = None  # bert | gpt (the reference code's GPT variant); None = the size's preset's (bert)
    tower_wide_embedding: bool = True  # embedding_size = hidden_size: FLOPs per token within 3% of GPT-2's
    steps: int = 5  # profiled steps of each model, alternating, after `warmup` untimed ones
    warmup: int = 2
    modes: list[str] = field(default_factory=lambda: ["none", "full"])  # compile modes: none | full | regional


def module_groups(name: str, model: nn.Module) -> dict[nn.Module, str]:
    """The modules whose forward opens a profiler range, and their group."""
    if name == TWO_TOWER:
        towers = model.model.towers
        groups = {model.lm_head: "vocabulary projection + loss", model.model.fusion: "fusion"}
        groups[towers.tower_norm] = "layer norms"
        for layer in towers.layers:
            for linear in (*layer.self_attn.children(), layer.mlp.up_proj, layer.mlp.down_proj):
                groups[linear] = "block matmuls"
            groups[layer.input_layernorm] = groups[layer.post_attention_layernorm] = "layer norms"
        return groups
    groups = {model.lm_head: "vocabulary projection + loss", model.transformer.ln_f: "layer norms"}
    for block in model.transformer.h:
        for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
            groups[linear] = "block matmuls"
        groups[block.ln_1] = groups[block.ln_2] = "layer norms"
    loss_function = model.loss_function

    def ranged_loss(*args, **kwargs):
        with record_function("group:vocabulary projection + loss"):
            return loss_function(*args, **kwargs)

    model.loss_function = ranged_loss
    return groups


def add_ranges(groups: dict[nn.Module, str]) -> None:
    for module, group in groups.items():
        ranges = []
        opened = record_function(f"group:{group}")
        module.register_forward_pre_hook(lambda *_, o=opened, r=ranges: r.append(o.__enter__()))
        module.register_forward_hook(lambda *_, r=ranges: r.pop().__exit__(None, None, None))


def shape_group(event, config) -> str:
    """The group of a matmul from its shapes (the only clue inside compiled code): a batched matmul over more than
    the towers is attention (batch x heads); GPT-2's block matmuls are plain ones."""
    dims = [dim for shape in event.input_shapes for dim in shape]
    if config.vocab_size in dims:
        return "vocabulary projection + loss"
    shapes = [shape for shape in event.input_shapes if len(shape) == 3]
    if shapes and shapes[-1][0] > config.num_towers:
        return "attention"
    return "block matmuls"


def name_group(event, config) -> str | None:
    """The group of an op or an inductor kernel (named after the ops it fuses) by its name, first match wins."""
    name = event.name
    if name in MATMUL_OPS:
        return shape_group(event, config)
    for words, group in NAME_GROUPS:
        if any(word in name for word in words):
            return group
    return None


def range_group(event, forward_groups: dict[int, str]) -> str | None:
    """The group of the nearest module range, attention op or (in backward) forward op above `event`, if any."""
    while event is not None:
        if event.name.startswith("group:"):
            return event.name[len("group:"):]
        if event.name == "aten::scaled_dot_product_attention":
            return "attention"
        if event.name.startswith("twotower::") and event.name.endswith(LOSS_OPERATOR_SUFFIX):
            return "vocabulary projection + loss"  # compiled, the loss is this one operator; its ops are inside it
        if event.name.startswith("autograd::engine::evaluate_function") and event.sequence_nr in forward_groups:
            return forward_groups[event.sequence_nr]
        event = event.cpu_parent
    return None


def event_group(event, forward_groups: dict[int, str], config) -> str:
    """An event's group: the optimizer range, a copy, a dropout mask, its range's group, else by its name."""
    parent = event.cpu_parent
    while parent is not None and parent.name != OPTIMIZER_RANGE:
        parent = parent.cpu_parent
    if parent is not None:
        return "optimizer step"
    if event.name in COPY_OPS:
        return "copies, permutes"
    if event.name == "aten::bernoulli_":
        return "dropout masks"
    return range_group(event, forward_groups) or name_group(event, config) or "other"


def forward_op_groups(events) -> dict[int, str]:
    """Module-range group of each forward op that made an autograd node, by its sequence number (its backward's)."""
    groups = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::") and event.sequence_nr not in groups:
            group = range_group(event, {})
            if group is not None:
                groups[event.sequence_nr] = group
    return groups


def training_step(name: str, config, mode: str, args: ProfileArguments):
    """One model's training step, as a function of no arguments (the model built, compiled and warmed up)."""
    model = build_model(name, config)
    if mode == "none":
        add_ranges(module_groups(name, model))
    callable_model = prepare_for_training(model, Setting(compile=mode), torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    input_ids = random_ids(config.vocab_size, args.micro_batch, config.max_position_embeddings, torch.device("cpu"))
    loss_kwargs = training_loss_kwargs(model)

    def step():
        callable_model(input_ids=input_ids, labels=input_ids, **loss_kwargs).loss.backward()
        with record_function(OPTIMIZER_RANGE):
            nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup):
        step()
    return step


def group_times(step, config) -> dict[str, float]:
    """ms of self-CPU time in each group over one profiled call of `step`."""
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    events = prof.events()
    forward_groups = forward_op_groups(events)
    times = dict.fromkeys(GROUPS, 0.0)
    for event in events:
        times[event_group(event, forward_groups, config)] += event.self_cpu_time_total / 1e3
    return times


def profile_models(config, mode: str, args: ProfileArguments) -> dict[str, dict[str, float]]:
    """Per model, each group's median ms per step over `args.steps` steps, the models' steps alternating."""
    steps = {name: training_step(name, config, mode, args) for name in (TWO_TOWER, GPT2_EQUAL_FLOPS)}
    samples = {name: [] for name in steps}
    for _ in range(args.steps):
        for name, step in steps.items():
            samples[name].append(group_times(step, config))
    return {
        name: {group: statistics.median(times[group] for times in runs) for group in GROUPS}
        for name, runs in samples.items()
    }


def markdown(columns: dict[str, dict[str, float]]) -> str:
    names = list(columns)
    lines = ["| group | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    totals = {name: sum(times.values()) for name, times in columns.items()}
    for group in GROUPS:
        cells = [f"{columns[n].get(group, 0.0):.1f} ms ({columns[n].get(group, 0.0) / totals[n]:.0%})" for n in names]
        lines.append(f"| {group} | " + " | ".join(cells) + " |")
    lines.append("| **step (sum of the medians)** | " + " | ".join(f"**{totals[n]:.1f} ms**" for n in names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> str:
    (args,) = HfArgumentParser(ProfileArguments).parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    torch.set_num_threads(1)
    torch._inductor.config.cpp.enable_kernel_profile = True  # compiled kernels by name in the profile
    bench_args = BenchmarkArguments(
        sizes=[args.size], hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
        vocab_size=args.vocab_size, layout=args.layout, tower_wide_embedding=args.tower_wide_embedding,
    )
    config = size_config(args.size, bench_args)
    columns = {}
    for mode in args.modes:
        print(f"profiling compile={mode}", flush=True)
        for name, times in profile_models(config, mode, args).items():
            columns[f"{name}, {'eager' if mode == 'none' else f'compile={mode}'}"] = times
    table = markdown(columns)
    print(table)
    return table


if __name__ == "__main__":
    main(sys.argv[1:])
