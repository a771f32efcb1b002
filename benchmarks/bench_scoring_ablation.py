"""Benchmark: what the mean-ablation preference adds to a scoring pass, measured side by side.

The scoring engine (evaluation/scoring/engine.py) runs the towers once per batch for the joint model and every probe;
with the ablation preference it runs them once more over the text for each tower's mean feature, and the joint head
once more per tower. This script times `score_blocks` with and without it on random blocks, interleaved in rounds,
and prints the ratio.

    python benchmarks/bench_scoring_ablation.py                 # the main job's model: tiny preset, 4096 tokens, 4 replicas
    python benchmarks/bench_scoring_ablation.py --blocks 32 --vocab_size 512 --repeats 2
"""

import argparse

import torch

from benchmarks.measure import time_interleaved
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from twotower.evaluation.scoring.engine import score_blocks


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--blocks", type=int, default=256, help="blocks scored per call")
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--probe_replicas", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4, help="timed calls of each, spread over --rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num_threads", type=int, default=None, help="torch threads (default: torch's)")
    return parser.parse_args(argv)


def run(args) -> dict:
    """{"without", "with"}: median seconds of one scoring call, and "ratio", with over without."""
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=args.vocab_size, max_position_embeddings=args.block_size,
                                        probe_replicas=args.probe_replicas)  # fmt: skip
    model = TwoTowerForCausalLM(config).eval()
    ids = torch.randint(0, args.vocab_size, (args.blocks, args.block_size))
    batches = [{"input_ids": batch} for batch in ids.split(args.batch_size)]
    calls = {
        "without": lambda: score_blocks(model, batches, disable_tqdm=True),
        "with": lambda: score_blocks(model, batches, ablation=True, disable_tqdm=True),
    }
    timings = time_interleaved(calls, torch.device("cpu"), warmup=1, repeats=args.repeats, rounds=args.rounds)
    result = {name: timing.median_s for name, timing in timings.items()}
    return result | {"ratio": result["with"] / result["without"]}


def main(argv=None):
    args = parse_args(argv)
    result = run(args)
    print(f"scoring {args.blocks} blocks of {args.block_size} tokens, vocabulary {args.vocab_size}, "
          f"{args.probe_replicas} probe replicas per tower, {torch.get_num_threads()} threads:")
    print(f"  without the ablation preference: {result['without']:.2f} s")
    print(f"  with it:                         {result['with']:.2f} s  ({result['ratio']:.2f}x)")
    return result


if __name__ == "__main__":
    main()
