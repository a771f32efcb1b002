"""Benchmark: the scoring pass (every probe replica and the ablation preference) eager against torch.compile.

`score_blocks` runs the towers (`model.model`), the joint head and the probes; this script times it on random blocks
with the model as it is and with those three parts compiled (`nn.Module.compile`, inference mode), interleaved in
rounds after an untimed warm-up call (which compiles), and prints the scored tokens/s of both and their ratio.

    python -m benchmarks.bench_scoring_compile --num_threads 1     # the main job's model: tiny, 4096 tokens, 4 replicas
"""

from twotower.evaluation.scoring.engine import score_blocks

from benchmarks.scoring_workload import median_seconds, parse_args, random_batches, scoring_line, scoring_model


def compiled(model):
    for part in (model.model, model.lm_head, model.probes):
        part.compile()
    return model


def run(args) -> dict:
    """{"eager", "compiled"}: scored tokens/s, and "ratio", compiled over eager."""
    batches = random_batches(args)
    models = {"eager": scoring_model(args), "compiled": compiled(scoring_model(args))}
    calls = {name: (lambda m=model: score_blocks(m, batches, ablation=True, disable_tqdm=True))
             for name, model in models.items()}  # fmt: skip
    scored_tokens = args.blocks * (args.block_size - 1)
    result = {name: scored_tokens / seconds for name, seconds in median_seconds(calls, args).items()}
    return result | {"ratio": result["compiled"] / result["eager"]}


def main(argv=None):
    args = parse_args(__doc__.strip().splitlines()[0], blocks=128, argv=argv)
    result = run(args)
    print(scoring_line(args, " (ablation on)"))
    print(f"  eager:    {result['eager']:,.0f} scored tokens/s")
    print(f"  compiled: {result['compiled']:,.0f} scored tokens/s  ({result['ratio']:.2f}x)")
    return result


if __name__ == "__main__":
    main()
