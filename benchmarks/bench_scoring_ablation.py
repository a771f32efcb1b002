"""Benchmark: what the mean-ablation preference adds to a scoring pass, measured side by side.

The scoring engine (evaluation/scoring/engine.py) runs the towers once per batch for the joint model and every probe;
with the ablation preference it runs them once more over the text for each tower's mean feature, and the joint head
once more per tower. This script times `score_blocks` with and without it on random blocks, interleaved in rounds,
and prints the ratio.

    python benchmarks/bench_scoring_ablation.py                 # the main job's model: tiny preset, 4096 tokens, 4 replicas
    python benchmarks/bench_scoring_ablation.py --blocks 32 --vocab_size 512 --repeats 2
"""

from twotower.evaluation.scoring.engine import score_blocks

from benchmarks.scoring_workload import median_seconds, parse_args, random_batches, scoring_line, scoring_model


def run(args) -> dict:
    """{"without", "with"}: median seconds of one scoring call, and "ratio", with over without."""
    model, batches = scoring_model(args), random_batches(args)
    result = median_seconds({
        "without": lambda: score_blocks(model, batches, disable_tqdm=True),
        "with": lambda: score_blocks(model, batches, ablation=True, disable_tqdm=True),
    }, args)  # fmt: skip
    return result | {"ratio": result["with"] / result["without"]}


def main(argv=None):
    args = parse_args(__doc__.strip().splitlines()[0], blocks=256, argv=argv)
    result = run(args)
    print(scoring_line(args))
    print(f"  without the ablation preference: {result['without']:.2f} s")
    print(f"  with it:                         {result['with']:.2f} s  ({result['ratio']:.2f}x)")
    return result


if __name__ == "__main__":
    main()
