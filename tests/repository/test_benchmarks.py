"""benchmarks/: the baselines, FLOP counts, memory measurement, settings search, report, and the command itself."""

import os
import signal
from functools import partial
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml
from accelerate.commands.config.config_args import load_config_from_file
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

import modeling_twotower.linear_cross_entropy as linear_cross_entropy_module
from benchmarks import (
    bench_linear_cross_entropy,
    bench_scoring_ablation,
    bench_speed,
    bench_ssm_tower,
    masked_lm_baseline,
    profile_step,
    project_scale,
    settings_search,
    workloads,
)
from benchmarks.baselines import (
    GPT2_EQUAL_FLOPS,
    GPT2_SAME_LOSS,
    MODEL_NAMES,
    REFERENCE,
    TWO_TOWER,
    TWO_TOWER_SSM,
    build_model,
    gold_logprobs,
    num_parameters,
    training_flops_per_token,
)
from benchmarks.measure import PeakFlops, PeakTensorMemory, time_interleaved
from benchmarks.own_process import InOwnProcess
from benchmarks.report import comparison_markdown, update_document
from benchmarks.settings_search import (
    SearchRow,
    accelerate_config,
    best_combination,
    fastest,
    one_at_a_time,
    search_fastest_setting,
    training_arguments,
)
from benchmarks.workloads import Setting, why_unsupported
from conftest import TINY_SIZES, tiny_two_tower_config
from modeling_twotower import TwoTowerConfig
from twotower.training.launch import throughput
from twotower.training.launch.throughput import resolve_peak_flops

BATCH, SEQ = 3, 7
VOCAB, HIDDEN, LAYERS, HEADS, FFN = (
    TINY_SIZES[name]
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
)


def tiny_config(**kwargs) -> TwoTowerConfig:
    return tiny_two_tower_config(**{"max_position_embeddings": 16, **kwargs})


def random_ids(seed=0):
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models gain nothing from threads, and on a busy machine threads waiting for each other make every
    # op many times slower; the command's --num_threads also changes this global, so it is restored after.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- baselines and FLOPs


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("num_towers, embedding_size", [(2, None), (3, None), (2, HIDDEN)])
def test_flops_per_token_equal_the_matmuls_torch_counts(name, num_towers, embedding_size):
    # Eager attention runs as plain matmuls, so torch's counter sees every FLOP of the nanoGPT estimate; the loss
    # without logits is one operator, counted by the formula it registers.
    config = tiny_config(num_towers=num_towers, embedding_size=embedding_size)
    model = build_model(name, config)
    model.set_attn_implementation("eager")
    input_ids = random_ids()
    with FlopCounterMode(display=False) as counter:
        model(input_ids=input_ids, labels=input_ids).loss.backward()
    assert counter.get_total_flops() / (BATCH * SEQ) == training_flops_per_token(name, config, SEQ)


def test_equal_flops_gpt2_has_the_towers_stack():
    config = tiny_config(num_towers=3)
    gpt2, two_tower = build_model(GPT2_EQUAL_FLOPS, config), build_model(TWO_TOWER, config)
    assert (gpt2.config.n_layer, gpt2.config.n_embd, gpt2.config.n_inner) == (3 * LAYERS, HIDDEN, FFN)
    gpt2_stack = sum(p.numel() for n, p in gpt2.transformer.h.named_parameters() if p.dim() == 2)
    two_tower_stack = sum(p.numel() for n, p in two_tower.model.towers.layers.named_parameters() if p.dim() == 3)
    assert gpt2_stack == two_tower_stack == 3 * LAYERS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN)


def test_gpt2_with_the_same_loss_computes_cross_entropy_through_its_tied_decoder():
    config = tiny_config()
    model = build_model(GPT2_SAME_LOSS, config).eval()
    with torch.no_grad():
        model.output_bias.normal_()  # a bias the loss must add
    input_ids = random_ids()
    loss = model(input_ids, labels=input_ids).loss
    grads = torch.autograd.grad(loss, list(model.parameters()))
    # independently: logits from the last hidden state and the embedding, then the next token's cross-entropy
    hidden_states = model.transformer(input_ids).last_hidden_state
    logits = hidden_states[:, :-1] @ model.transformer.wte.weight.T + model.output_bias
    expected = F.cross_entropy(logits.reshape(-1, VOCAB), input_ids[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected)
    for grad, expected_grad in zip(grads, torch.autograd.grad(expected, list(model.parameters()))):
        torch.testing.assert_close(grad, expected_grad)
    # GPT-2's stack and tied decoder, plus the output bias
    gpt2 = build_model(GPT2_EQUAL_FLOPS, config)
    assert num_parameters(model) == num_parameters(gpt2) + VOCAB
    with torch.no_grad():
        torch.testing.assert_close(gold_logprobs(model, input_ids).mean(), -expected)


def test_reference_shares_one_embedding_and_keeps_towers_apart():
    config = tiny_config()
    reference = build_model(REFERENCE, config).eval()
    assert all(tower.wte is reference.embed_tokens for tower in reference.towers)
    assert reference.lm_head.weight is reference.embed_tokens.weight
    input_ids = random_ids()
    before = reference.tower_hidden_states(input_ids)
    with torch.no_grad():
        for parameter in reference.towers[1].h.parameters():
            parameter.add_(0.5)
    after = reference.tower_hidden_states(input_ids)
    torch.testing.assert_close(after[0], before[0], rtol=0, atol=0)
    assert not torch.allclose(after[1], before[1])
    # probes score one after the other; check against cross-entropy computed independently
    expected = torch.stack(
        [
            -F.cross_entropy(probe(hidden[:, :-1]).transpose(1, 2), input_ids[:, 1:], reduction="none")
            for probe, hidden in zip(reference.probes, after)
        ]
    )
    with torch.no_grad():
        torch.testing.assert_close(gold_logprobs(reference, input_ids), expected)
    assert num_parameters(reference) < sum(p.numel() for p in reference.parameters())  # probes left out


def test_gpt2_scoring_is_the_language_models_own_log_probability():
    gpt2 = build_model(GPT2_EQUAL_FLOPS, tiny_config()).eval()
    input_ids = random_ids()
    with torch.no_grad():
        loss = gpt2(input_ids, labels=input_ids).loss
        scored = gold_logprobs(gpt2, input_ids)
    assert scored.shape == (BATCH, SEQ - 1)
    torch.testing.assert_close(-scored.mean(), loss)


# ---------------------------------------------------------------- measurement


def test_a_given_peak_wins_over_the_datasheet(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert resolve_peak_flops(torch.device("cuda"), torch.bfloat16, 123.0) == (123e12, "given with --peak_tflops")
    with pytest.raises(ValueError, match="--peak_tflops 0.0 must be a positive number"):
        resolve_peak_flops(torch.device("cpu"), torch.float32, 0.0)


@pytest.mark.parametrize(
    "device_name, dtype, float32_precision, tflops, source",
    [
        ("NVIDIA H100 80GB HBM3", torch.bfloat16, "highest", 989.4, "H100 dense bf16 peak (datasheet)"),
        ("NVIDIA H100 PCIe", torch.bfloat16, "highest", 756.5, "H100 PCIe dense bf16 peak (datasheet)"),
        ("NVIDIA H100 NVL", torch.float16, "highest", 835.5, "H100 NVL dense fp16 peak (datasheet)"),
        ("NVIDIA H200", torch.float32, "highest", 67.0, "H200 dense fp32 peak (datasheet)"),
        ("NVIDIA A100-SXM4-80GB", torch.float32, "high", 156.0, "A100 dense tf32 peak (datasheet)"),
    ],
    ids=["H100-bf16", "H100-PCIe-bf16", "H100-NVL-fp16", "H200-fp32", "A100-tf32"],
)
def test_a_known_gpu_gets_its_datasheet_peak_for_the_dtype(
    monkeypatch, device_name, dtype, float32_precision, tflops, source
):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: device_name)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: float32_precision)
    assert resolve_peak_flops(torch.device("cuda"), dtype) == (tflops * 1e12, source)
    if dtype == torch.bfloat16:  # the benchmark's MFU peak, in bf16 on accelerators
        peak = PeakFlops(torch.device("cuda"))
        assert (peak.value, peak.source, peak.is_measured) == (tflops * 1e12, source, False)


def test_on_the_cpu_the_peak_is_a_measured_matmul_rate(monkeypatch):
    timings = []
    real_measure = throughput.measure_peak_flops

    def measure(device, dtype):
        timings.append(real_measure(device, dtype))
        return timings[-1]

    monkeypatch.setattr(throughput, "measure_peak_flops", measure)
    value, source = resolve_peak_flops(torch.device("cpu"), torch.float32)
    assert source == "measured: float32 square-matmul rate" and [value] == timings and value > 1e8


def test_the_benchmark_keeps_the_best_measured_rate(monkeypatch):
    planted_rates = iter([3e9, 9e9, 4e9, 12e9])  # three timings before the run, then one after a round
    monkeypatch.setattr(throughput, "measure_peak_flops", lambda device, dtype: next(planted_rates))
    monkeypatch.setattr("benchmarks.measure.measure_peak_flops", lambda device, dtype: next(planted_rates))
    peak = PeakFlops(torch.device("cpu"))
    assert peak.value == 9e9 and peak.is_measured
    assert peak.source == "measured: best float32 square-matmul rate of the run"
    peak.sample()
    assert peak.value == 12e9


def test_peak_tensor_memory_counts_live_storages_once():
    a = torch.ones(1000, 250)  # 1 MB
    with PeakTensorMemory([a]) as tracker:
        b = a * 2  # 2 MB live
        view = b[:10]  # a view: no new storage
        c = b + a  # 3 MB: the peak
        del b, view, c  # back to 1 MB
        d = torch.cat([a, a])  # 1 + 2 MB
    assert tracker.peak_bytes == 3_000_000
    assert tracker.current_bytes == 3_000_000
    del d
    assert tracker.current_bytes == 1_000_000


def test_timing_runs_blocks_of_calls_in_rounds():
    log = []
    calls = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}

    def between_rounds():
        log.append("|")

    timings = time_interleaved(calls, torch.device("cpu"), warmup=1, repeats=3, rounds=2, each_round=between_rounds)
    # round 1: a (1 untimed + 2 timed), b (same); round 2: one timed call each after an untimed one
    assert "".join(log) == "aaabbb|aabb|"
    assert [len(timings[name].seconds) for name in calls] == [3, 3]


TINY_BENCHMARK = dict(vocab_size=97, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=24,
                      seq_len=12)


def tiny_training_step_build(name):
    config = bench_speed.size_config("tiny", bench_speed.BenchmarkArguments(**TINY_BENCHMARK))
    input_ids = workloads.random_ids(config.vocab_size, 2, 12, torch.device("cpu"))
    return partial(bench_speed.training_step, name, config, Setting(), torch.device("cpu"), input_ids)


def test_a_training_step_in_its_own_process_is_timed_there_and_holds_the_same_memory():
    build = tiny_training_step_build(TWO_TOWER)
    with InOwnProcess(build, num_threads=1) as worker:
        assert worker.pid != os.getpid() and worker.tokens == 2 * 12 and worker.measures_memory
        seconds = worker.time_block(warmup=1, count=2)
        timings = time_interleaved({"worker": worker}, torch.device("cpu"), warmup=0, repeats=3, rounds=3)
        peak = worker.peak_memory()
    assert len(seconds) == 2 and len(timings["worker"].seconds) == 3 and min(seconds + timings["worker"].seconds) > 0
    with pytest.raises(ProcessLookupError):  # closed: the process has ended
        os.kill(worker.pid, 0)
    here = build()
    for _ in range(6):  # the worker's calls: the weights, gradients and optimizer state are the same
        here()
    assert peak == here.peak_memory() > 0


def test_a_worker_process_that_fails_or_dies_says_why():
    with pytest.raises(RuntimeError, match="Unknown model 'no-such-model'"):
        InOwnProcess(tiny_training_step_build("no-such-model"), num_threads=1)
    with InOwnProcess(tiny_training_step_build(TWO_TOWER), num_threads=1) as worker:
        os.kill(worker.pid, signal.SIGKILL)  # as the kernel kills a process out of memory
        with pytest.raises(RuntimeError, match=f"exit code -{signal.SIGKILL.value} \\(killed for memory"):
            worker.time_block(warmup=0, count=1)


# ---------------------------------------------------------------- settings search


def test_unsupported_settings_on_cpu_say_why():
    cpu = torch.device("cpu")
    assert "NVIDIA" in why_unsupported(Setting(precision="tf32"), cpu)
    assert "accelerators" in why_unsupported(Setting(precision="fp16"), cpu)
    assert why_unsupported(Setting(precision="bf16", attn_implementation="eager"), cpu) is None
    with pytest.raises(ValueError, match="precision"):
        Setting(precision="fp8")


def test_quick_search_changes_one_value_at_a_time_then_combines_the_winners():
    settings = one_at_a_time(["fp32", "bf16"], ["sdpa", "eager"], ["none", "regional"], [False, True])
    baseline = Setting()
    assert settings == [
        baseline,
        Setting(precision="bf16"),
        Setting(attn_implementation="eager"),
        Setting(compile="regional"),
        Setting(activation_checkpointing=True),
    ]
    rates = [100.0, 150.0, 90.0, 130.0, 70.0]  # bf16 and regional compilation win alone; eager and checkpoints lose
    rows = [SearchRow(setting, "ok", 8, rate) for setting, rate in zip(settings, rates)]
    assert best_combination(rows, baseline) == Setting(precision="bf16", compile="regional")
    assert fastest(rows).setting == Setting(precision="bf16")


def test_search_finds_the_largest_fitting_micro_batch_and_prunes_slow_settings(monkeypatch):
    # Planted step times and memory limit: micro-batches up to 4 fit; bf16 steps take 10x as long as fp32 ones.
    seconds_per_sequence = {"fp32": 1.0, "bf16": 10.0}

    def planted_fits(config, setting, device, micro_batch, seq_len, memory_budget_bytes):
        return micro_batch <= 4, seconds_per_sequence[setting.precision] * micro_batch

    monkeypatch.setattr(settings_search, "fits", planted_fits)
    rows = search_fastest_setting(
        config=tiny_config(),
        device=torch.device("cpu"),
        settings=[Setting(), Setting(precision="bf16"), Setting(precision="tf32")],
        seq_len=SEQ,
        max_micro_batch=16,
        memory_budget_bytes=None,
        warmup=0,
        repeats=1,
        log=lambda line: None,
    )
    assert (rows[0].status, rows[0].micro_batch) == ("ok", 4)
    assert rows[0].tokens_per_s > 0 and rows[0].peak_memory_bytes > 0
    assert rows[1].status == "pruned: a step at micro-batch 1 took 10.0x the fastest"
    assert rows[2].status.startswith("skipped: TF32")


def test_fastest_setting_prints_as_an_accelerate_config_and_training_arguments(tmp_path):
    setting = Setting(precision="bf16", compile="regional", activation_checkpointing=True)
    path = tmp_path / "fastest.yaml"
    path.write_text(yaml.safe_dump(accelerate_config(setting, torch.device("cuda"))))
    loaded = load_config_from_file(str(path))
    assert (loaded.mixed_precision, loaded.use_cpu, loaded.num_processes) == ("bf16", False, 1)
    assert loaded.dynamo_config["dynamo_backend"] == "INDUCTOR"
    assert loaded.dynamo_config["dynamo_use_regional_compilation"] is True
    arguments = training_arguments(SearchRow(setting, "ok", micro_batch=48), global_batch_size=5120)
    # 5120 sequences per optimizer step from micro-batches of 48: 107 accumulation steps (5136 sequences)
    assert arguments == [
        "--per_device_train_batch_size", "48", "--gradient_accumulation_steps", "107",
        "--mixed_precision", "bf16", "--gradient_checkpointing", "true",
    ]  # fmt: skip


# ---------------------------------------------------------------- report and command


def test_update_document_rewrites_only_its_own_section(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Benchmarks\n\nWritten by hand.\n")
    update_document(path, "cpu:tiny", "CPU, tiny", "first")
    update_document(path, "gpu:base", "GPU, base", "gpu figures")
    update_document(path, "cpu:tiny", "CPU, tiny", "second")
    text = path.read_text()
    assert text.startswith("# Benchmarks\n\nWritten by hand.\n")
    assert "second" in text and "first" not in text and "gpu figures" in text
    assert text.index("CPU, tiny") < text.index("GPU, base")
    assert [p.name for p in tmp_path.iterdir()] == ["BENCHMARKS.md"]  # no temporary file left behind


def test_benchmark_command_runs_on_a_tiny_config(tmp_path, capsys):
    output = tmp_path / "BENCHMARKS.md"
    argv = ["--sizes", "tiny", "--vocab_size", "97", "--hidden_size", "16", "--num_hidden_layers", "1"]
    argv += ["--num_attention_heads", "2", "--intermediate_size", "24", "--seq_len", "12", "--micro_batch", "2"]
    argv += ["--new_tokens", "4", "--warmup", "1", "--repeats", "1", "--num_threads", "1", "--device", "cpu"]
    argv += ["--search", "--quick", "--max_micro_batch", "2", "--search_compile_modes", "none"]
    argv += ["--search_precisions", "fp32", "tf32", "--search_activation_checkpointing", "off"]
    argv += ["--tower_wide_embedding", "--output", str(output), "--compiled_twin", "none"]  # compiling takes minutes
    results = bench_speed.main(argv)

    comparison = results["sizes"]["tiny"]["comparison"]
    assert comparison["own_processes"]  # on the CPU by default
    models = comparison["models"]
    assert models[REFERENCE]["decode"] is None and models[GPT2_SAME_LOSS]["decode"] is None
    for name in MODEL_NAMES:
        assert models[name]["train"]["tokens_per_s"] > 0 and models[name]["train"]["peak_memory_bytes"] > 0
        assert models[name]["score"]["tokens_per_s"] > 0
    ratio = models[TWO_TOWER]["train"]["tokens_per_s"] / models[GPT2_EQUAL_FLOPS]["train"]["tokens_per_s"]
    assert comparison["ratios"][GPT2_EQUAL_FLOPS]["train"] == pytest.approx(ratio)

    rows = results["sizes"]["tiny"]["search"]["rows"]
    statuses = {str(row.setting): row.status for row in rows}
    assert statuses["fp32, sdpa"] == "ok" and statuses["tf32, sdpa"].startswith("skipped")
    assert {row.micro_batch for row in rows if row.status == "ok"} == {2}

    text = output.read_text()
    for expected in ("| two-tower |", "| gpt2-equal-flops |", "| gpt2-same-loss |", "| reference |",
                     "distributed_type: 'NO'", "each model trained in a process of its own."):
        assert expected in text
    # the printed launch builds the benchmarked model from the recipe's
    model_options = "--hidden_size 16 --num_hidden_layers 1 --num_attention_heads 2 --intermediate_size 24"
    assert f"--recipe tiny {model_options} --embedding_size 16 --per_device_train_batch_size 2" in text
    assert text.count("<!-- benchmark:") == text.count("<!-- /benchmark:") == 1  # one section
    assert ":tiny:tower-wide-embedding -->" in text and "embedding and tied decoder 16 wide" in text
    assert "| two-tower |" in capsys.readouterr().out


def test_eager_and_compiled_ratios_side_by_side():
    def measured(tokens_per_s):
        return {"tokens_per_s": tokens_per_s, "call_s": 1.0, "peak_memory_bytes": None}

    eager = {TWO_TOWER: 100.0, GPT2_EQUAL_FLOPS: 125.0, GPT2_SAME_LOSS: 160.0, REFERENCE: 80.0}
    compiled = {TWO_TOWER: 150.0, GPT2_EQUAL_FLOPS: 120.0, GPT2_SAME_LOSS: 200.0, REFERENCE: 100.0}
    rows = {
        name: {"parameters": 1e6, "flops_per_token": 1e6, "train": measured(eager[name]), "score": measured(1.0),
               "decode": None, "train_compiled": measured(compiled[name])}
        for name in MODEL_NAMES
    }  # fmt: skip
    comparison = {"setting": "fp32, sdpa", "compiled_setting": "fp32, sdpa, compile=full", "micro_batch": 2,
                  "decode_batch": 2, "new_tokens": 1, "prompt_len": 1, "repeats": 1, "rounds": 1, "warmup": 0,
                  "models": rows}  # fmt: skip
    bench_speed.add_mfu_and_ratios(comparison, peak_flops=1e9)
    ratios = comparison["ratios"]
    assert ratios[GPT2_EQUAL_FLOPS]["train"] == pytest.approx(0.8) and ratios[REFERENCE]["train"] == pytest.approx(1.25)
    assert ratios[GPT2_EQUAL_FLOPS]["train_compiled"] == pytest.approx(1.25)
    assert ratios[REFERENCE]["train_compiled"] == pytest.approx(1.5)
    assert rows[TWO_TOWER]["compile_speedup"] == pytest.approx(1.5)
    text = comparison_markdown(comparison)
    assert "| gpt2-equal-flops | 125 | 120 | 0.96x | 0.80x | 1.25x |" in text
    assert "| reference | 80 | 100 | 1.25x | 1.25x | 1.50x |" in text
    assert "| gpt2-same-loss | 160 | 200 | 1.25x | 0.62x | 0.75x |" in text


def test_the_state_space_towers_get_their_row_eager_without_decoding(capsys):
    argv = ["--sizes", "tiny", "--vocab_size", "97", "--hidden_size", "16", "--num_hidden_layers", "1"]
    argv += ["--num_attention_heads", "2", "--intermediate_size", "24", "--seq_len", "12", "--micro_batch", "2"]
    argv += ["--new_tokens", "4", "--warmup", "0", "--repeats", "1", "--num_threads", "1", "--device", "cpu"]
    argv += ["--compiled_twin", "none", "--ssm_row", "--own_processes", "false"]
    comparison = bench_speed.main(argv)["sizes"]["tiny"]["comparison"]
    assert not comparison["own_processes"]
    ssm = comparison["models"][TWO_TOWER_SSM]
    assert ssm["train"]["tokens_per_s"] > 0 and ssm["score"]["tokens_per_s"] > 0 and ssm["decode"] is None
    assert ssm["parameters"] == num_parameters(build_model(TWO_TOWER_SSM, bench_speed.size_config(
        "tiny", bench_speed.BenchmarkArguments(vocab_size=97, hidden_size=16, num_hidden_layers=1,
                                               num_attention_heads=2, intermediate_size=24, seq_len=12))))  # fmt: skip
    two_tower = comparison["models"][TWO_TOWER]["train"]["tokens_per_s"]
    assert comparison["ratios"][TWO_TOWER_SSM]["train"] == pytest.approx(two_tower / ssm["train"]["tokens_per_s"])
    assert "| two-tower-ssm |" in capsys.readouterr().out


def test_profile_groups_a_training_step_by_module():
    config = tiny_two_tower_config(layout="gpt", embedding_size=TINY_SIZES["hidden_size"])
    args = profile_step.ProfileArguments(micro_batch=2, steps=1, warmup=1)
    times = profile_step.profile_models(config, "none", args)
    for name in (TWO_TOWER, GPT2_EQUAL_FLOPS):
        for group in ("block matmuls", "attention", "layer norms", "vocabulary projection + loss", "optimizer step"):
            assert times[name][group] > 0, (name, group)
    assert times[TWO_TOWER]["fusion"] > 0 and times[GPT2_EQUAL_FLOPS]["fusion"] == 0
    assert "| fusion |" in profile_step.markdown({name: times[name] for name in times})


def test_profile_puts_what_runs_inside_the_loss_operator_under_the_loss():
    # compiled, no module range surrounds the loss: its exponentials and sums are children of its operator's event
    config = tiny_two_tower_config()
    operator = SimpleNamespace(name=f"twotower::{linear_cross_entropy_module._OPERATOR.split('::')[1]}",
                               cpu_parent=None, sequence_nr=-1)  # fmt: skip
    for name in ("aten::exp_", "aten::sum", "aten::addmm_"):
        event = SimpleNamespace(name=name, cpu_parent=operator, sequence_nr=-1, input_shapes=[])
        assert profile_step.event_group(event, {}, config) == "vocabulary projection + loss", name
    outside = SimpleNamespace(name="aten::exp_", cpu_parent=None, sequence_nr=-1, input_shapes=[])
    assert profile_step.event_group(outside, {}, config) == "other"


@pytest.mark.parametrize("size, width", [("tiny", 64), ("small", 192), ("base", 384)])
def test_tower_wide_embedding_brings_the_flops_to_about_gpt2s(size, width):
    paper = bench_speed.size_config(size, bench_speed.BenchmarkArguments(sizes=[size]))
    narrow = bench_speed.size_config(size, bench_speed.BenchmarkArguments(sizes=[size], tower_wide_embedding=True))
    assert (paper.embedding_size, narrow.embedding_size, narrow.hidden_size) == (2 * width, width, width)
    gpt2 = training_flops_per_token(GPT2_EQUAL_FLOPS, narrow, 128)
    # the default layout's decoder is twice as wide as GPT-2's; the tower-wide one adds only the small
    # per-tower projections and the fusion layer
    assert training_flops_per_token(TWO_TOWER, paper, 128) / gpt2 > 1.2
    assert 1.0 < training_flops_per_token(TWO_TOWER, narrow, 128) / gpt2 < 1.05


@pytest.mark.parametrize("size", ["tiny", "small", "base"])
def test_the_gpt_layout_is_the_reference_codes_at_gpt2s_flops(size):
    gpt = bench_speed.size_config(size, bench_speed.BenchmarkArguments(sizes=[size], layout="gpt"))
    wide = bench_speed.size_config(size, bench_speed.BenchmarkArguments(sizes=[size], tower_wide_embedding=True))
    assert (gpt.layout, wide.layout, gpt.embedding_size) == ("gpt", "bert", gpt.hidden_size)
    assert training_flops_per_token(REFERENCE, gpt, 128) == training_flops_per_token(TWO_TOWER, gpt, 128)
    # no embedding norm and no per-tower projections: only the fusion layer above GPT-2's FLOPs
    gpt2 = training_flops_per_token(GPT2_EQUAL_FLOPS, gpt, 128)
    assert gpt2 < training_flops_per_token(TWO_TOWER, gpt, 128) < training_flops_per_token(TWO_TOWER, wide, 128)
    # the printed launch trains the benchmarked layout
    assert bench_speed.recipe_budget(size, gpt, bench_speed.BenchmarkArguments())["model_arguments"][:2] == [
        "--layout", "gpt"
    ]


def test_a_layout_without_transformer_towers_is_refused_before_any_work():
    with pytest.raises(ValueError, match="--layout 'elmo' is not a layout of transformer towers; choose one of"):
        bench_speed.BenchmarkArguments(layout="elmo")


def test_neighbour_count_losses_match_hand_counted_witten_bell():
    # training text 0 1 2 0 1 3 (add-one unigram over 5 types: 3, 3, 2, 2, 1 / 11); one block 0 [MASK] 2 whose
    # tokens 1 (hidden) and 2 (shown unchanged) are targets; the second's neighbours are [MASK] and the block's edge
    unigram = {1: 3 / 11, 2: 2 / 11}
    p_left = (2 + 1 * unigram[1]) / (2 + 1)  # after 0: token 1 twice, one type
    p_right = (1 + 1 * unigram[1]) / (1 + 1)  # before 2: token 1 once
    p_both = (1 + 1 * (p_left + p_right) / 2) / (1 + 1)  # between 0 and 2: token 1 once
    batch = {"input_ids": torch.tensor([[0, 4, 2]]), "labels": torch.tensor([[-100, 1, 2]])}
    losses = masked_lm_baseline.neighbour_count_losses(np.array([0, 1, 2, 0, 1, 3]), 5, [batch], mask_token_id=4)
    expected = {
        "unigram": -(np.log(unigram[1]) + np.log(unigram[2])) / 2,
        "left": -(np.log(p_left) + np.log(unigram[2])) / 2,
        "right": -(np.log(p_right) + np.log(unigram[2])) / 2,
        "both": -(np.log(p_both) + np.log(unigram[2])) / 2,
    }
    assert losses == pytest.approx(expected, rel=1e-12)


def test_scale_projection_of_base_pretraining_matches_a_hand_count():
    # base: 2 towers x 12 layers of width 384 (MLP 1536) reading a 768-wide embedding, fusion 768 -> 768, tied decoder
    # 768 x 30528; 6 FLOPs per matmul weight plus 12 x layers x towers x width x block for attention
    towers = 2 * (768 * 384 + 12 * (4 * 384**2 + 2 * 384 * 1536))
    fusion_and_decoder = (768 + 30528) * 768
    per_token = 6 * (towers + fusion_and_decoder) + 12 * 12 * 2 * 384 * 128
    tokens = 12_500 * 5120 * 128  # the recipe's steps x global batch x block size
    flops = project_scale.training_flops(project_scale.read_phase("base"))
    assert (flops["per_token"], flops["tokens"]) == (per_token, tokens) == (416_710_656, 8_192_000_000)
    assert flops["total"] == pytest.approx(per_token * tokens)
    # 8.7 hours on one A100 at 312 TFLOP/s and 35% MFU
    hours = per_token * tokens / (312e12 * 0.35) / 3600
    assert project_scale.hours(flops["total"], 312.0, 1, 0.35) == pytest.approx(hours) == pytest.approx(8.68, abs=0.01)
    assert "| `base` | pretrain | 417 M | 8.19e+09 | 3.41e+18 | 8.7 h |" in project_scale.main([])


def test_the_projected_probe_cache_is_the_choice_of_the_package_rule():
    # base_probe: 900k blocks x 127 positions x 2 towers x 384 x 2 bytes (bf16) = 175.6 GB > its probe_cache_max_gb
    # 50 and > 40 GB (half an 80 GB GPU): recomputed. base_masked_probe: 15% of 128 positions, 26.5 GB: in memory
    phase = project_scale.read_phase("base_probe")
    assert project_scale.cache_bytes(phase, 2) == 900_000 * 127 * 2 * 384 * 2
    assert project_scale.cache_choice(phase).choice == "none"
    masked = project_scale.read_phase("base_masked_probe")
    assert project_scale.cache_bytes(masked, 2) == pytest.approx(900_000 * 0.15 * 128 * 2 * 384 * 2)
    assert project_scale.cache_choice(masked).choice == "memory"
    table = project_scale.main([])
    assert "| 176 / 351 GB (auto: none) |" in table and "| 27 / 53 GB (auto: memory) |" in table


def test_the_ssm_benchmark_times_both_towers_and_the_scan_by_chunk(capsys):
    result = bench_ssm_tower.main(["--repeats", "1", "--rounds", "1", "--batch_size", "1", "--block_size", "16",
                                   "--chunks", "4", "32", "--scan_lengths", "16"])  # fmt: skip
    assert result["ratio"] > 0
    # chunks as long as the sequence or longer are the sequential scan, timed once
    assert set(result["scan_speedups"]) == {(16, 4), (16, 16)} and result["scan_speedups"][16, 16] == 1.0
    assert "scan of 16 positions, one chunk (sequential)" in capsys.readouterr().out


def test_the_ablation_benchmark_times_both_scoring_passes(capsys):
    result = bench_scoring_ablation.main(["--blocks", "4", "--block_size", "16", "--batch_size", "2",
                                          "--vocab_size", "64", "--probe_replicas", "2", "--repeats", "2"])  # fmt: skip
    assert result["with"] > 0 and result["without"] > 0
    assert result["ratio"] == pytest.approx(result["with"] / result["without"])
    assert "with it:" in capsys.readouterr().out


def test_the_loss_without_logits_benchmark_times_both_and_holds_less_memory(capsys):
    result = bench_linear_cross_entropy.main(["--tokens", "256", "--hidden_size", "16", "--vocab_size", "512",
                                              "--repeats", "2", "--rounds", "1", "--piece_rows", "8", "256",
                                              "--torch_chunked"])  # fmt: skip
    assert result["8_rows"][0] > 0 and result["256_rows"][0] > 0  # one piece of all 256 rows, and 32 of 8
    assert result["torch_chunked"][0] > 0
    (with_ms, with_peak), (without_ms, without_peak) = result["with_logits"], result["without_logits"]
    assert with_ms > 0 and without_ms > 0 and result["ratio"] == pytest.approx(with_ms / without_ms)
    logits_bytes = 256 * 512 * 4
    assert with_peak - without_peak > logits_bytes  # the [tokens, vocab] logits (and their gradient) never exist
    assert f"{result['ratio']:.2f}x the logits' speed" in capsys.readouterr().out


def test_the_loss_benchmark_times_a_mixed_precision_step_and_refuses_what_the_device_cannot_run(capsys):
    result = bench_linear_cross_entropy.main(["--tokens", "64", "--hidden_size", "16", "--vocab_size", "512",
                                              "--repeats", "1", "--rounds", "1", "--precision", "bf16",
                                              "--device", "cpu"])  # fmt: skip
    (with_ms, with_peak), (without_ms, without_peak) = result["with_logits"], result["without_logits"]
    assert with_ms > 0 and without_ms > 0
    assert with_peak > without_peak + 64 * 512 * 2  # the bf16 logits and their float32 upcast exist only with logits
    assert "bf16, " in capsys.readouterr().out
    with pytest.raises(ValueError, match="--precision fp16 cannot run on cpu"):
        bench_linear_cross_entropy.main(["--precision", "fp16", "--device", "cpu"])
