"""Markdown for the benchmark's results, and the update of docs/BENCHMARKS.md one (machine, size) section at a time."""

import os
import re
from pathlib import Path

import yaml

from twotower.training.utils.atomic import write_text_atomically

from .baselines import TWO_TOWER
from .measure import is_under_load
from .settings_search import SearchRow, accelerate_config, fastest, launch_notes, training_arguments

NEW_DOCUMENT = "# Benchmarks\n\nThe sections below are written by `python -m benchmarks.bench_speed --output FILE`.\n"
WORKLOADS = ("train", "decode", "score")


def rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def memory(num_bytes: int | None) -> str:
    if num_bytes is None:
        return "n/a"
    return f"{num_bytes / 2**30:.2f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.1f} minutes"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:,.1f} days"


def machine_line(info: dict, peak_flops: float, peak_source: str) -> str:
    where = info["accelerator"] or f"{info['cpu']} ({info['cpu_cores']} cores, {info['torch_threads']} torch threads)"
    line = (
        f"Machine: {where}; Python {info['python']}, torch {info['torch']}, transformers {info['transformers']}, "
        f"accelerate {info['accelerate']}. Peak for MFU: {peak_flops / 1e12:.3g} TFLOP/s ({peak_source})."
    )
    if is_under_load(info):
        line += (
            f" **Measured under load**: other processes kept the load average at "
            f"{info['load_average_at_start']} on {info['cpu_cores']} cores when the run started, so rates are low "
            f"and noisy; the ratios, taken in one run, are the figures to read."
        )
    return line


def config_line(config, seq_len: int) -> str:
    return (
        f"{config.num_towers} towers x {config.num_hidden_layers} layers ({config.layout} layout), width "
        f"{config.hidden_size}, {config.num_attention_heads} heads, MLP {config.intermediate_size}, vocabulary "
        f"{config.vocab_size}, embedding and tied decoder {config.embedding_size} wide, sequence {seq_len}"
    )


def comparison_markdown(comparison: dict) -> str:
    """Figures of the three models and the two-tower model's ratios to the two baselines."""
    rows = comparison["models"]
    lines = [
        f"Setting: {comparison['setting']}; training and scoring micro-batch {comparison['micro_batch']}, decoding "
        f"{comparison['decode_batch']} sequences x {comparison['new_tokens']} new tokens after a "
        f"{comparison['prompt_len']}-token prompt. Each figure is the median of {comparison['repeats']} calls "
        f"timed in {comparison['rounds']} round(s) over the models, each model's block of calls after "
        f"{comparison['warmup']} untimed one(s)"
        f"{'; each model trained in a process of its own' if comparison.get('own_processes') else ''}.",
        "",
        "| model | parameters | training GFLOP/token | train tokens/s | step | train peak memory | MFU "
        "| decode tokens/s | decode peak memory | scored tokens/s | scoring peak memory |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        train, decode, score = (row[workload] for workload in WORKLOADS)
        lines.append(
            f"| {name} | {row['parameters'] / 1e6:.2f} M | {row['flops_per_token'] / 1e9:.3g} | "
            f"{rate(train['tokens_per_s'])} | {train['call_s']:.3g} s | {memory(train['peak_memory_bytes'])} | "
            f"{percent(row['mfu'])} | {rate(decode and decode['tokens_per_s'])} | "
            f"{memory(decode and decode['peak_memory_bytes'])} | {rate(score['tokens_per_s'])} | "
            f"{memory(score['peak_memory_bytes'])} |"
        )
    if comparison.get("compiled_setting"):
        lines += ["", compiled_markdown(comparison)]
    lines += [
        "",
        f"| {TWO_TOWER} / baseline | FLOPs per token | train tokens/s | MFU | decode tokens/s | scored tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, ratios in comparison["ratios"].items():
        lines.append(
            f"| {name} | {ratio(ratios['flops_per_token'])} | {ratio(ratios['train'])} | {ratio(ratios['mfu'])} | "
            f"{ratio(ratios['decode'])} | {ratio(ratios['score'])} |"
        )
    return "\n".join(lines)


def compiled_markdown(comparison: dict) -> str:
    """Training tokens/s eager and compiled (timed in the same rounds), and the two-tower model's ratios in both."""
    rows, ratios = comparison["models"], comparison["ratios"]
    lines = [
        f"Training eager ({comparison['setting']}) and compiled ({comparison['compiled_setting']}), timed in the "
        "same rounds:",
        "",
        f"| model | eager tokens/s | compiled tokens/s | compile speedup | {TWO_TOWER} / model, eager "
        f"| {TWO_TOWER} / model, compiled |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        eager, compiled = ("-", "-") if name == TWO_TOWER else (ratios[name]["train"], ratios[name]["train_compiled"])
        cells = [ratio(value) if value != "-" else "-" for value in (eager, compiled)]
        compiled_rate = row["train_compiled"] and row["train_compiled"]["tokens_per_s"]
        lines.append(
            f"| {name} | {rate(row['train']['tokens_per_s'])} | {rate(compiled_rate)} | "
            f"{ratio(row['compile_speedup'])} | {cells[0]} | {cells[1]} |"
        )
    return "\n".join(lines)


def search_markdown(search: dict, device) -> str:
    """The search's table, then the fastest setting as an Accelerate config, a launch command and a projection."""
    rows: list[SearchRow] = search["rows"]
    lines = [
        f"Fastest-setting search ({search['mode']}), two-tower training on dummy tokens; micro-batch: the "
        f"largest power of two up to {search['max_micro_batch']} that fits.",
        "",
        "| setting | micro-batch | tokens/s | step | peak memory | MFU | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        step = "n/a" if row.step_s is None else f"{row.step_s:.3g} s"
        lines.append(
            f"| {row.setting} | {row.micro_batch or 'n/a'} | {rate(row.tokens_per_s)} | {step} | "
            f"{memory(row.peak_memory_bytes)} | {percent(row.mfu)} | {row.status} |"
        )
    lines += [f"- {note}" for note in search["notes"]]
    best = fastest(rows)
    if best is None:
        return "\n".join(lines + ["", "No setting could be measured."])
    recipe_tokens = search["recipe_tokens"]
    arguments = search["model_arguments"] + training_arguments(best, search["global_batch_size"])
    recipe = f"--recipe {search['recipe']} " if search["recipe"] else ""
    lines += [
        "",
        f"Fastest: **{best.setting}**, micro-batch {best.micro_batch}, {rate(best.tokens_per_s)} tokens/s "
        f"(MFU {percent(best.mfu)}). As an Accelerate config (`fastest.yaml`):",
        "",
        "```yaml",
        yaml.safe_dump(accelerate_config(best.setting, device), sort_keys=False).rstrip(),
        "```",
        "",
        "```bash",
        f"accelerate launch --config_file fastest.yaml -m twotower.training.train {recipe}{' '.join(arguments)}",
        "```",
    ]
    lines += [f"- {note}" for note in launch_notes(best.setting)]
    if recipe_tokens is not None:
        lines.append(
            f"- Projected time for {search['recipe_description']}: "
            f"{duration(recipe_tokens / best.tokens_per_s)} on one such device."
        )
    return "\n".join(lines)


def update_document(path: str | os.PathLike, key: str, title: str, body: str) -> Path:
    """Replace (or append) the section `key` of the markdown file at `path`, keeping everything else; atomic."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.exists() else NEW_DOCUMENT
    begin, end = f"<!-- benchmark:{key} -->", f"<!-- /benchmark:{key} -->"
    section = f"{begin}\n### {title}\n\n{body}\n{end}"
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), flags=re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text)
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_text_atomically(path, text)
