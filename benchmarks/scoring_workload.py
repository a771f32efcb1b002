"""What the scoring benchmarks share: their options, the tiny model they score with, its random blocks, and the
interleaved timing of scoring calls (bench_scoring_ablation.py, bench_scoring_compile.py)."""

import argparse

import torch

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM

from .measure import time_interleaved


def parse_args(description: str, blocks: int, argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--blocks", type=int, default=blocks, help="blocks scored per call")
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--probe_replicas", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4, help="timed calls of each, spread over --rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num_threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    return args


def scoring_model(args) -> TwoTowerForCausalLM:
    """The main job's model (the tiny preset) at the given vocabulary, block size and probe replicas, in eval mode."""
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=args.vocab_size, max_position_embeddings=args.block_size,
                                        probe_replicas=args.probe_replicas)  # fmt: skip
    return TwoTowerForCausalLM(config).eval()


def random_batches(args) -> list[dict]:
    """`args.blocks` random blocks of `args.block_size` tokens, in batches of `args.batch_size`."""
    ids = torch.randint(0, args.vocab_size, (args.blocks, args.block_size), generator=torch.Generator().manual_seed(0))
    return [{"input_ids": batch} for batch in ids.split(args.batch_size)]


def median_seconds(calls: dict, args) -> dict:
    """{name: median seconds of one call}, the calls timed in `args.rounds` rounds after one untimed call each."""
    timings = time_interleaved(calls, torch.device("cpu"), warmup=1, repeats=args.repeats, rounds=args.rounds)
    return {name: timing.median_s for name, timing in timings.items()}


def scoring_line(args, what: str = "") -> str:
    return (f"scoring {args.blocks} blocks of {args.block_size} tokens{what}, vocabulary {args.vocab_size}, "
            f"{args.probe_replicas} probe replicas per tower, {torch.get_num_threads()} threads:")
