"""
Speed of the two-tower model side by side (issue #7): Hugging Face GPT-2 with equal FLOPs per token (one
tower's width, num_towers * layers deep), the same GPT-2 trained through the two-tower model's own loss (what the
towers cost, the loss aside) and the reference code's approach (one GPT-2 per tower, run one after the other, then
the fusion head), measured in one run on one machine: training tokens/s, step time, peak
memory and MFU (on the CPU each model trains in a process of its own, its steps timed in rounds over the models),
cached greedy decoding (tokens/s) and the scoring pipeline (scored tokens/s), with the ratios.
With --search, the fastest training setting for this machine ("$100K or 100 Days"), printed as an Accelerate
config plus training arguments and the projected time of a recipe.

CPU (figures of docs/BENCHMARKS.md; on a shared machine keep --num_threads at or below the free cores):
    python -m benchmarks.bench_speed --sizes tiny small --search --quick --repeats 4 --rounds 2 \
        --num_threads 1 --output docs/BENCHMARKS.md
One GPU (bf16 autocast by default there), the paper's sizes, the full settings grid:
    python -m benchmarks.bench_speed --sizes base large --search --global_batch_size 5120 --output docs/BENCHMARKS.md
A smoke run (seconds):
    python -m benchmarks.bench_speed --sizes tiny --vocab_size 128 --seq_len 32 --micro_batch 2 --quick
"""

import contextlib
import os
import sys
from dataclasses import asdict, dataclass, field, replace
from functools import partial

import torch
from transformers import HfArgumentParser

from modeling_twotower import TwoTowerConfig
from modeling_twotower.towers import TOWER_KINDS
from twotower.training.arguments import RECIPES_DIR, TwoTowerTrainingConfig, read_recipe

from .baselines import (
    CACHED_DECODING,
    MODEL_NAMES,
    TWO_TOWER,
    TWO_TOWER_SSM,
    build_model,
    num_parameters,
    training_flops_per_token,
)
from .measure import PeakFlops, machine_info, release_memory
from .own_process import InOwnProcess
from .report import comparison_markdown, config_line, machine_line, search_markdown, update_document
from .settings_search import best_combination, candidate_settings, one_at_a_time, search_fastest_setting
from .workloads import (
    ATTN_IMPLEMENTATIONS,
    COMPILE_MODES,
    PRECISIONS,
    Decoding,
    Scoring,
    Setting,
    TrainingStep,
    measure,
    random_ids,
    why_unsupported,
)

# Sizes by name: a model preset plus overrides.
SIZES = {
    "tiny": ("tiny", {"vocab_size": 4096}),  # the tiny recipe's BPE vocabulary (tokenizer_vocab_size)
    # between tiny and base: the paper's vocabulary at a width and depth a CPU trains in seconds per step
    "small": ("base", {"hidden_size": 192, "num_hidden_layers": 6, "num_attention_heads": 6, "intermediate_size": 768}),
    "base": ("base", {}),
    "large": ("large", {}),
}
CPU_MICRO_BATCH, ACCELERATOR_MICRO_BATCH = 8, 64  # the comparison's default micro-batch
CPU_MAX_MICRO_BATCH, CPU_QUICK_MAX_MICRO_BATCH, ACCELERATOR_MAX_MICRO_BATCH = 32, 8, 1024  # search caps
# Architecture fields the training takes as options; the vocabulary comes from the tokenizer.
ARCHITECTURE_OPTIONS = (
    "layout", "num_towers", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "embedding_size",
)
TRANSFORMER_LAYOUTS = TOWER_KINDS["transformer"].layouts  # the baselines are transformers too
COMPILED = "(compiled)"  # the name suffix of a model's compiled twin in the training measurement
CPU_MEMORY_BUDGET_FRACTION = 0.75  # of the RAM: what a CPU micro-batch may use (accelerators stop at out-of-memory)


@dataclass
class BenchmarkArguments:
    # what to measure
    sizes: list[str] = field(default_factory=lambda: ["tiny"])  # names in SIZES: tiny | small | base | large
    vocab_size: int | None = None  # override for every size; None keeps the size's value (likewise below)
    hidden_size: int | None = None  # width of ONE tower
    num_hidden_layers: int | None = None  # layers per tower
    num_attention_heads: int | None = None
    intermediate_size: int | None = None
    num_towers: int | None = None
    layout: str | None = None  # the two-tower model's layout: bert | gpt; None = the size's preset's. gpt (the
    # reference code's GPT variant, which `reference` runs too) feeds the h-wide embedding to every tower unprojected
    tower_wide_embedding: bool = False  # embedding_size = hidden_size, the bert layout keeping its embedding norm and
    # per-tower projections (the default, num_towers * hidden_size, is the paper's)
    seq_len: int | None = None  # tokens per sequence; None = the model's max_position_embeddings (128, the recipes')
    micro_batch: int | None = None  # sequences per training step and scoring call; None = 8 on CPU, 64 on GPUs
    new_tokens: int | None = None  # tokens generated per sequence; None = seq_len // 2, the prompt being the rest

    # setting of the side-by-side comparison
    precision: str | None = None  # fp32 | tf32 | bf16 | fp16; None = bf16 on GPUs that have it, else fp32
    attn_implementation: str = "sdpa"  # sdpa | eager
    compile: str = "none"  # none | full | regional (training only; decoding and scoring run uncompiled)
    compiled_twin: str = "full"  # with compile=none, training is also timed compiled this way (full | regional) in
    # the same rounds, for eager and compiled ratios side by side; none times it eager only
    activation_checkpointing: bool = False
    ssm_row: bool = False  # also time the model with state-space towers (tower_type ssm, the same sizes): training
    # eager and scoring (not compiled: its scan is a Python loop over positions; no decoding: it has no state cache)

    # timing and hardware
    warmup: int = 1  # untimed calls before each block of timed calls of one workload
    repeats: int | None = None  # timed calls per workload, the median is reported; None = 6 (3 with --quick)
    rounds: int | None = None  # the timed calls are split into this many rounds over the models (fairer under
    # load that comes and goes); None = 2 (1 with --quick)
    own_processes: bool | None = None  # train each model in a process of its own, as the training command runs
    # it (on the CPU, a model's step in one process with the others runs in a heap they shaped: docs/speed.md);
    # None = on the CPU only (accelerators' caching allocators reuse freed memory, and each process would hold one)
    device: str = "auto"  # auto (the accelerator if there is one, else cpu) | cpu | cuda | cuda:1 ...
    num_threads: int | None = None  # torch CPU threads; None = torch's default (one per core). On a shared machine
    # use fewer: threads that wait for a descheduled sibling at every op make each op many times slower
    peak_tflops: float | None = None  # peak for MFU; None = datasheet bf16 peak of known GPUs, else measured matmul

    # fastest-setting search (two-tower training)
    search: bool = False
    quick: bool = False  # search each value alone, then the best combination (not the grid); fewer timed calls
    search_precisions: list[str] = field(default_factory=lambda: list(PRECISIONS))
    search_attn_implementations: list[str] = field(default_factory=lambda: list(ATTN_IMPLEMENTATIONS))
    search_compile_modes: list[str] = field(default_factory=lambda: list(COMPILE_MODES))
    search_activation_checkpointing: list[str] = field(default_factory=lambda: ["off", "on"])  # off | on
    max_micro_batch: int | None = None  # cap of the micro-batch search; None = 1024 on GPUs, 32 on CPU (8 quick)
    memory_budget_gb: float | None = None  # CPU micro-batches must stay under it; None = 75% of the RAM
    recipe: str | None = None  # training recipe to project the time of; None = the recipe named like the size
    global_batch_size: int | None = None  # sequences per optimizer step; None = the recipe's on one process

    # output
    output: str | None = None  # markdown file whose sections for this machine and these sizes are rewritten

    def __post_init__(self):
        unknown = sorted(set(self.sizes) - set(SIZES))
        if unknown:
            raise ValueError(f"Unknown sizes {unknown}; choose from {list(SIZES)}.")
        if self.layout not in (None, *TRANSFORMER_LAYOUTS):
            raise ValueError(
                f"--layout {self.layout!r} is not a layout of transformer towers; choose one of {TRANSFORMER_LAYOUTS}."
            )
        for name in ("seq_len", "micro_batch", "new_tokens", "max_micro_batch", "global_batch_size"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name} must be a positive integer, got {getattr(self, name)}.")
        Setting(self.precision or "fp32", self.attn_implementation, self.compile)  # validates the values
        Setting(compile=self.compiled_twin)
        for values, allowed in (
            (self.search_precisions, PRECISIONS),
            (self.search_attn_implementations, ATTN_IMPLEMENTATIONS),
            (self.search_compile_modes, COMPILE_MODES),
            (self.search_activation_checkpointing, ("off", "on")),
        ):
            if not values or set(values) - set(allowed):
                raise ValueError(f"Search values {values} must be a non-empty subset of {list(allowed)}.")
        if self.repeats is None:
            self.repeats = 3 if self.quick else 6
        if self.rounds is None:
            self.rounds = min(self.repeats, 1 if self.quick else 2)
        if self.num_threads is not None and self.num_threads < 1:
            raise ValueError(f"--num_threads must be >= 1, got {self.num_threads}.")
        if not (self.repeats >= self.rounds >= 1 and self.warmup >= 0):
            raise ValueError(
                f"Need --repeats >= --rounds >= 1 and --warmup >= 0, got {self.repeats}, {self.rounds}, {self.warmup}."
            )


def resolve_device(name: str) -> torch.device:
    if name != "auto":
        return torch.device(name)
    return torch.accelerator.current_accelerator() if torch.accelerator.is_available() else torch.device("cpu")


def size_config(size: str, args: BenchmarkArguments) -> TwoTowerConfig:
    preset, overrides = SIZES[size]
    fields = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    given = {name: getattr(args, name) for name in (*fields, "num_towers", "layout") if getattr(args, name) is not None}
    if args.seq_len is not None:
        given["max_position_embeddings"] = args.seq_len
    config = TwoTowerConfig.from_preset(preset, **{**overrides, **given})
    if args.tower_wide_embedding:
        config.embedding_size = config.hidden_size  # a validated width: nothing else to check
    return config


def compare_models(config, device, setting, args, each_round=None) -> dict:
    """
    Train, score and decode with the models on the same dummy tokens, timed in rounds over the models.
    MFU and ratios are left to `add_mfu_and_ratios`, once the run's peak FLOP/s is known.
    """
    seq_len = args.seq_len or config.max_position_embeddings
    micro_batch = args.micro_batch or (CPU_MICRO_BATCH if device.type == "cpu" else ACCELERATOR_MICRO_BATCH)
    new_tokens = args.new_tokens or seq_len // 2
    if not 0 < new_tokens < seq_len:
        raise ValueError(f"--new_tokens must be between 1 and seq_len - 1 ({seq_len - 1}), got {new_tokens}.")
    input_ids = random_ids(config.vocab_size, micro_batch, seq_len, device)
    prompt_ids = input_ids[:, : seq_len - new_tokens]
    timing = dict(device=device, warmup=args.warmup, repeats=args.repeats, rounds=args.rounds, each_round=each_round)

    own_processes = device.type == "cpu" if args.own_processes is None else args.own_processes
    print(f"  training{', each model in a process of its own' if own_processes else ''}", flush=True)
    names = MODEL_NAMES + ((TWO_TOWER_SSM,) if args.ssm_row else ())
    # the models scoring and decoding use, on the CPU until then; training builds its own copies (each step's model
    # is built where it runs), so no checkpointing, compilation or optimizer state reaches these
    models = {name: build_model(name, config) for name in names}
    rows = {name: {"parameters": num_parameters(model)} for name, model in models.items()}
    cpu_ids = input_ids.cpu()  # what a worker process receives; each step moves it to the device
    builds = {name: partial(training_step, name, config, setting, device, cpu_ids) for name in names}
    twin = compiled_twin_setting(setting, args)
    if twin is not None:  # each model also compiled, a fresh copy with the same weights, timed in the same rounds
        for name in MODEL_NAMES:
            builds[f"{name} {COMPILED}"] = partial(training_step, name, config, twin, device, cpu_ids)
    with contextlib.ExitStack() as processes:
        if own_processes:  # started together, so that their imports and models overlap
            steps = {name: processes.enter_context(InOwnProcess(build, torch.get_num_threads()))
                     for name, build in builds.items()}  # fmt: skip
        else:
            steps = {name: build() for name, build in builds.items()}
        train = measure(steps, **timing)
        del steps
    release_memory(device)
    print("  scoring", flush=True)
    score = measure({name: Scoring(model, setting, input_ids) for name, model in models.items()}, **timing)
    print("  decoding (the reference code and GPT-2 with the same loss have no cached generation)", flush=True)
    decoding = {
        name: Decoding(model, setting, prompt_ids, new_tokens)
        for name, model in models.items()
        if name in CACHED_DECODING
    }
    decode = measure(decoding, **timing)
    for name, row in rows.items():
        row["flops_per_token"] = training_flops_per_token(name, config, seq_len)
        row.update(train=asdict(train[name]), score=asdict(score[name]))
        compiled = train.get(f"{name} {COMPILED}")
        row["train_compiled"] = None if compiled is None else asdict(compiled)
        row["decode"] = asdict(decode[name]) if name in decode else None
    del models, decoding
    release_memory(device)
    return {
        "setting": str(setting),
        "compiled_setting": None if twin is None else str(twin),
        "own_processes": own_processes,
        "micro_batch": micro_batch,
        "decode_batch": micro_batch,
        "new_tokens": new_tokens,
        "prompt_len": seq_len - new_tokens,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "models": rows,
    }


def training_step(name: str, config, setting: Setting, device: torch.device, input_ids) -> TrainingStep:
    """A training step of the model `name`, built where it will run (this process or its own)."""
    return TrainingStep(build_model(name, config), setting, device, input_ids.to(device))


def compiled_twin_setting(setting: Setting, args: BenchmarkArguments) -> Setting | None:
    """The compiled setting training is also timed in, or None (compiled already, or --compiled_twin none)."""
    if setting.compile != "none" or args.compiled_twin == "none":
        return None
    return replace(setting, compile=args.compiled_twin)


def add_mfu_and_ratios(comparison: dict, peak_flops: float) -> None:
    """MFU of each model's training at the run's peak, and the two-tower model's ratio to each baseline."""
    rows = comparison["models"]
    for row in rows.values():
        row["mfu"] = row["train"]["tokens_per_s"] * row["flops_per_token"] / peak_flops
        compiled = row.get("train_compiled")
        row["compile_speedup"] = None if compiled is None else compiled["tokens_per_s"] / row["train"]["tokens_per_s"]
    two_tower = rows[TWO_TOWER]
    comparison["ratios"] = {}
    for name in [name for name in rows if name != TWO_TOWER]:
        baseline = rows[name]
        ratios = {key: two_tower[key] / baseline[key] for key in ("flops_per_token", "mfu")}
        for workload in ("train", "train_compiled", "score", "decode"):
            rates = (two_tower[workload], baseline[workload])
            ratios[workload] = None if None in rates else rates[0]["tokens_per_s"] / rates[1]["tokens_per_s"]
        comparison["ratios"][name] = ratios


def recipe_budget(size: str, config: TwoTowerConfig, args: BenchmarkArguments) -> dict:
    """The recipe whose time is projected: its name, global batch, training tokens (None when open-ended), and the
    train options that turn its model into `config`."""
    recipe = args.recipe or (size if (RECIPES_DIR / f"{size}.yaml").is_file() else None)
    values = read_recipe(recipe) if recipe else {}
    default_batch = values.get("per_device_train_batch_size", 16) * values.get("gradient_accumulation_steps", 1)
    global_batch = args.global_batch_size or default_batch
    steps, block_size = values.get("max_train_steps"), values.get("block_size", 128)
    recipe_config = TwoTowerConfig.from_preset(
        values.get("model_preset", TwoTowerTrainingConfig.model_preset),
        **{name: values[name] for name in ARCHITECTURE_OPTIONS if name in values},
    )
    tokens = steps * global_batch * block_size if steps else None
    description = (
        f"recipe `{recipe}` ({steps:,} steps x {global_batch:,} sequences x {block_size} tokens = {tokens:.3g} tokens)"
        if tokens
        else None
    )
    model_arguments = []
    for name in ARCHITECTURE_OPTIONS:
        if getattr(config, name) != getattr(recipe_config, name):
            model_arguments += [f"--{name}", str(getattr(config, name))]
    return {
        "recipe": recipe,
        "model_arguments": model_arguments,  # train options that turn the recipe's model into the benchmarked one
        "global_batch_size": global_batch,
        "recipe_tokens": tokens,
        "recipe_description": description,
    }


def run_search(config, device, args, size, each_round=None) -> dict:
    """The fastest-setting search at this size: the grid, or with --quick each value alone then the best mix."""
    seq_len = args.seq_len or config.max_position_embeddings
    budget = recipe_budget(size, config, args)
    cap = args.max_micro_batch or (
        (CPU_QUICK_MAX_MICRO_BATCH if args.quick else CPU_MAX_MICRO_BATCH)
        if device.type == "cpu"
        else ACCELERATOR_MAX_MICRO_BATCH
    )
    cap = min(cap, budget["global_batch_size"])
    memory_budget = None
    if device.type == "cpu":
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        given = args.memory_budget_gb * 2**30 if args.memory_budget_gb else None
        memory_budget = int(given or CPU_MEMORY_BUDGET_FRACTION * ram)
    axes = (
        args.search_precisions,
        args.search_attn_implementations,
        args.search_compile_modes,
        [value == "on" for value in args.search_activation_checkpointing],
    )
    search = dict(config=config, device=device, seq_len=seq_len, max_micro_batch=cap, memory_budget_bytes=memory_budget)
    search.update(warmup=args.warmup, repeats=args.repeats, each_round=each_round)
    print(f"  settings search ({'quick' if args.quick else 'grid'}):", flush=True)
    if args.quick:
        settings = one_at_a_time(*axes)
        rows = search_fastest_setting(settings=settings, **search)
        combined = best_combination(rows, settings[0]) if rows[0].status == "ok" else settings[0]
        if combined not in settings:
            rows += search_fastest_setting(settings=[combined], **search)
    else:
        rows = search_fastest_setting(settings=candidate_settings(*axes), **search)
    gpus = torch.accelerator.device_count() if device.type != "cpu" else 0
    why = f"this machine has {gpus} GPU(s)" if gpus < 2 else "the benchmark runs one process"
    notes = [
        f"DDP vs FSDP vs ZeRO: not searched ({why}); compare them by launching the training with "
        f"training/accelerate_configs/ddp.yaml, fsdp.yaml and deepspeed_zero2.yaml"
    ]
    mode = "each value alone, then the best combination" if args.quick else "full grid"
    flops = training_flops_per_token(TWO_TOWER, config, seq_len)
    return {"rows": rows, "notes": notes, "mode": mode, "max_micro_batch": cap, "flops_per_token": flops, **budget}


def run_benchmarks(args: BenchmarkArguments) -> dict:
    """Measure every size in `args.sizes`; print each section, write it to `args.output`; return all figures."""
    device = resolve_device(args.device)
    precision = args.precision or ("bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32")
    setting = Setting(precision, args.attn_implementation, args.compile, args.activation_checkpointing)
    reason = why_unsupported(setting, device)
    if reason is not None:
        raise ValueError(f"The comparison's setting ({setting}) cannot run on {device}: {reason}.")
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)
    info = machine_info(device)
    peak = PeakFlops(device, args.peak_tflops)
    machine_key = (info["accelerator"] or f"cpu {info['cpu']}").replace(" ", "-")
    results = {"machine": info, "sizes": {}}
    for size in args.sizes:
        config = size_config(size, args)
        seq_len = args.seq_len or config.max_position_embeddings
        print(f"[{size}] {config_line(config, seq_len)} on {device}", flush=True)
        result = {"comparison": compare_models(config, device, setting, args, each_round=peak.sample)}
        if args.search:
            result["search"] = run_search(config, device, args, size, each_round=peak.sample)
        # MFU last: a measured peak is the best matmul rate of all rounds so far
        add_mfu_and_ratios(result["comparison"], peak.value)
        body = [machine_line(info, peak.value, peak.source), "", f"Model: {config_line(config, seq_len)}.", ""]
        body.append(comparison_markdown(result["comparison"]))
        if args.search:
            for row in result["search"]["rows"]:
                if row.status == "ok":
                    row.mfu = row.tokens_per_s * result["search"]["flops_per_token"] / peak.value
            body += ["", search_markdown(result["search"], device)]
        print("\n" + "\n".join(body) + "\n", flush=True)
        if args.output:
            variants = ([f"{args.layout} layout"] if args.layout else []) + (
                ["tower-wide embedding"] if args.tower_wide_embedding else []
            )
            title = ", ".join([f"{info['accelerator'] or 'CPU'}, size `{size}`", *variants])
            key = ":".join([machine_key, size, *(variant.replace(" ", "-") for variant in variants)])
            update_document(args.output, key, title, "\n".join(body))
        results["sizes"][size] = result
    results.update(peak_flops=peak.value, peak_source=peak.source)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = HfArgumentParser(BenchmarkArguments)
    (args,) = parser.parse_args_into_dataclasses(args=argv, look_for_args_file=False)
    return run_benchmarks(args)


if __name__ == "__main__":
    main(sys.argv[1:])
