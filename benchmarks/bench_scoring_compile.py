"""Benchmark: the scoring pass (every probe replica and the ablation preference) eager against torch.compile.

`score_blocks` runs the towers (`model.model`), the joint head and the probes; this script times it on random blocks
with the model as it is and with those three parts compiled (`nn.Module.compile`, inference mode), interleaved in
rounds after an untimed warm-up call (which compiles), and prints the scored tokens/s of both and their ratio.

    python -m benchmarks.bench_scoring_compile --num_threads 1     # the main job's model: tiny, 4096 tokens, 4 replicas
"""

import argparse

import torch

from benchmarks.measure import time_interleaved
from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from twotower.evaluation.scoring.engine import score_blocks


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--blocks", type=int, default=128, help="blocks scored per call")
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--vocab_size", type=int, default=4096)
    parser.add_argument("--probe_replicas", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=4, help="timed calls of each, spread over --rounds")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num_threads", type=int, default=None, help="torch threads (default: torch's)")
    return parser.parse_args(argv)


def scoring_model(args, compiled: bool) -> TwoTowerForCausalLM:
    torch.manual_seed(0)
    config = TwoTowerConfig.from_preset("tiny", vocab_size=args.vocab_size, max_position_embeddings=args.block_size,
                                        probe_replicas=args.probe_replicas)  # fmt: skip
    model = TwoTowerForCausalLM(config).eval()
    if compiled:
        for part in (model.model, model.lm_head, model.probes):
            part.compile()
    return model


def run(args) -> dict:
    """{"eager", "compiled"}: scored tokens/s, and "ratio", compiled over eager."""
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    ids = torch.randint(0, args.vocab_size, (args.blocks, args.block_size), generator=torch.Generator().manual_seed(0))
    batches = [{"input_ids": batch} for batch in ids.split(args.batch_size)]
    models = {name: scoring_model(args, name == "compiled") for name in ("eager", "compiled")}
    calls = {name: (lambda m=model: score_blocks(m, batches, ablation=True, disable_tqdm=True))
             for name, model in models.items()}  # fmt: skip
    timings = time_interleaved(calls, torch.device("cpu"), warmup=1, repeats=args.repeats, rounds=args.rounds)
    scored_tokens = args.blocks * (args.block_size - 1)
    result = {name: scored_tokens / timing.median_s for name, timing in timings.items()}
    return result | {"ratio": result["compiled"] / result["eager"]}


def main(argv=None):
    args = parse_args(argv)
    result = run(args)
    print(f"scoring {args.blocks} blocks of {args.block_size} tokens (ablation on), vocabulary {args.vocab_size}, "
          f"{args.probe_replicas} probe replicas per tower, {torch.get_num_threads()} threads:")
    print(f"  eager:    {result['eager']:,.0f} scored tokens/s")
    print(f"  compiled: {result['compiled']:,.0f} scored tokens/s  ({result['ratio']:.2f}x)")
    return result


if __name__ == "__main__":
    main()
