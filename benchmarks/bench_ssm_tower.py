"""
Training tokens/s of the state-space towers (`tower_type="ssm"`) next to the transformer towers at equal parameters
(the tiny and tiny_ssm recipes' models), each model in a process of its own (as the training command runs it) and
timed in rounds over both so that both see the same machine load;
the selective scan alone (forward and backward at the ssm model's mixer shapes) in chunks of each length asked for
(`scan_chunk`'s own marked) against one chunk, the sequential scan (one position per step); and what batching the
towers could gain: the two towers' mixers run one after the other, against one mixer on both towers' batches at once
(shared weights: the most a batched kernel could save).

    python -m benchmarks.bench_ssm_tower --repeats 8 --rounds 4 --batch_size 4 --num_threads 1
"""

import argparse
import contextlib
import statistics
import time
from functools import partial

import torch
from torch.nn import functional as F

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from modeling_twotower.towers_ssm import SSM_STATE_SIZE, SelectiveScan, scan_chunk

from .measure import time_interleaved
from .own_process import InOwnProcess
from .workloads import Setting, TrainingStep

VOCAB = 4096  # the tiny recipes' tokenizer
SSM_CHANNELS = 192  # tiny_ssm's intermediate_size: its towers' parameters equal the transformer towers'
MODELS = {"transformer": {}, "ssm": {"tower_type": "ssm", "intermediate_size": SSM_CHANNELS}}
CPU = torch.device("cpu")


def build(name: str) -> TwoTowerForCausalLM:
    torch.manual_seed(0)
    return TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB, **MODELS[name])).train()


def training_step(name: str, input_ids: torch.LongTensor) -> TrainingStep:
    """A training step (forward, backward, clipping, AdamW) of the model `name`, built where it will run."""
    return TrainingStep(build(name), Setting(), CPU, input_ids)


def scan_inputs(batch_size: int, seq_len: int) -> list[torch.Tensor]:
    """(time_step, A, B, C, channels) at the ssm model's mixer shapes, drawn as its mixers make them."""
    generator = torch.Generator().manual_seed(0)
    time_step = F.softplus(torch.randn(batch_size, seq_len, SSM_CHANNELS, generator=generator) - 3)
    A = -torch.arange(1, SSM_STATE_SIZE + 1, dtype=torch.float32).repeat(SSM_CHANNELS, 1)
    B, C = torch.randn(2, batch_size, seq_len, SSM_STATE_SIZE, generator=generator)
    channels = torch.randn(batch_size, seq_len, SSM_CHANNELS, generator=generator)
    return [value.requires_grad_() for value in (time_step, A, B, C, channels)]


def scan_call(inputs, chunk: int):
    # backward from a dense gradient, as the mixer hands the scan one: `.sum()`'s is one value broadcast (stride 0),
    # over which the gradients' matrix products take another, slower path
    output_grad = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(2))
    return lambda: SelectiveScan.apply(*inputs, chunk).backward(output_grad)


def mixer_seconds(mixers, inputs, together: bool) -> float:
    start = time.perf_counter()
    if together:  # one mixer over both towers' batches
        mixers[0](torch.cat(list(inputs))).sum().backward()
    else:
        sum(mixer(tower_inputs).sum() for mixer, tower_inputs in zip(mixers, inputs)).backward()
    return time.perf_counter() - start


def compare_training(args) -> float:
    """Prints both models' training tokens/s; returns the ssm towers' ratio to the transformer towers'."""
    models = {name: build(name) for name in MODELS}
    input_ids = torch.randint(0, VOCAB, (args.batch_size, args.block_size), generator=torch.Generator().manual_seed(1))
    for name, model in models.items():
        print(f"{name}: {model.num_parameters(exclude_embeddings=True) / 1e3:.1f}k non-embedding parameters, "
              f"{sum(p.numel() for p in model.model.towers.parameters()) / 1e3:.1f}k in the towers")
    with contextlib.ExitStack() as processes:
        steps = {
            name: processes.enter_context(InOwnProcess(partial(training_step, name, input_ids), args.num_threads))
            for name in MODELS
        }
        timings = time_interleaved(steps, CPU, warmup=1, repeats=args.repeats, rounds=args.rounds)
    rates = {name: input_ids.numel() / timing.median_s for name, timing in timings.items()}
    ratio = rates["ssm"] / rates["transformer"]
    print(f"training tokens/s (each model in a process of its own), median of {args.repeats} steps in {args.rounds} "
          f"rounds: transformer {rates['transformer']:.0f}, ssm {rates['ssm']:.0f}, ssm / transformer {ratio:.3f}")

    mixers = [tower[0].mixer for tower in models["ssm"].model.towers.forward_blocks]
    inputs = torch.randn(len(mixers), args.batch_size, args.block_size, models["ssm"].config.hidden_size)
    looped = [mixer_seconds(mixers, inputs, together=False) for _ in range(args.rounds)]
    together = [mixer_seconds(mixers, inputs, together=True) for _ in range(args.rounds)]
    print(f"one layer of both towers, forward + backward: one after the other {statistics.median(looped):.3f} s, "
          f"one mixer over both batches {statistics.median(together):.3f} s")
    return ratio


def compare_chunks(args) -> dict:
    """The scan's forward + backward in chunks of each of `args.chunks` and as one chunk, at each length (as many
    sequences as make the training step's tokens); prints the medians and each one's speedup over one chunk."""
    speedups = {}
    for seq_len in args.scan_lengths:
        inputs = scan_inputs(max(1, args.batch_size * args.block_size // seq_len), seq_len)
        calls = {chunk: scan_call(inputs, chunk) for chunk in args.chunks if chunk < seq_len}
        calls[seq_len] = scan_call(inputs, seq_len)  # one chunk: one position per step
        timings = time_interleaved(calls, CPU, warmup=1, repeats=args.repeats, rounds=args.rounds)
        sequential_s = timings[seq_len].median_s
        for chunk, timing in timings.items():
            speedups[seq_len, chunk] = sequential_s / timing.median_s
            name = "one chunk (sequential)" if chunk == seq_len else f"chunks of {chunk}"
            name += " (the rule's)" if chunk == scan_chunk(seq_len) else ""
            print(f"scan of {seq_len} positions, {name}: {timing.median_s * 1e3:.1f} ms, "
                  f"{speedups[seq_len, chunk]:.2f}x the sequential scan")
    return speedups


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8, help="timed calls of each, spread over --rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--chunks", type=int, nargs="+", default=[8, 16, 32, 64], help="scan chunk lengths")
    parser.add_argument("--scan_lengths", type=int, nargs="+", default=[128, 512, 1024], help="positions scanned")
    args = parser.parse_args(argv)
    if min(args.chunks + args.scan_lengths) < 1 or not args.repeats >= args.rounds >= 1:
        parser.error(f"need positive --chunks and --scan_lengths and --repeats >= --rounds >= 1, got {vars(args)}")
    torch.set_num_threads(args.num_threads)
    return {"ratio": compare_training(args), "scan_speedups": compare_chunks(args)}


if __name__ == "__main__":
    main()
