"""Benchmark: vectorized tower-preference aggregation vs the reference code's Python dict loop.

The reference implementation aggregates gold log-probabilities per token type by appending each
prediction to per-token Python lists, then averaging them. This script reimplements that loop and
times it side by side with `PreferenceAccumulator` on synthetic predictions: Zipf-distributed token
ids over a 30k vocabulary and two towers' log-probabilities.

    python benchmarks/bench_preference.py                      # 10M predictions, dict loop timed on 1M
    python benchmarks/bench_preference.py --dict_loop_predictions 10000000   # time the dict loop on all

The dict loop is timed on a subsample (the first --dict_loop_predictions predictions) and its time is
scaled linearly to the full size; its cost per prediction does not depend on the total. The output
says so. Both paths are checked to give the same per-type preferences on that subsample.
"""

import argparse
import collections
import time

import numpy as np

from twotower.evaluation import PreferenceAccumulator


ZIPF_EXPONENT = 1.0  # word frequencies in natural text fall roughly as 1 / rank
BATCH_PREDICTIONS = 128 * 128  # one scoring batch: 128 sequences of 128 tokens


def make_predictions(num_predictions, vocab_size, seed):
    """Synthetic predictions: token ids [n] (Zipf over vocab_size) and two towers' log-probs [2, n] (float32)."""
    rng = np.random.default_rng(seed)
    frequency = 1.0 / np.arange(1, vocab_size + 1) ** ZIPF_EXPONENT
    token_ids = rng.choice(vocab_size, size=num_predictions, p=frequency / frequency.sum())
    gold_logprobs = -rng.exponential(scale=3.0, size=(2, num_predictions)).astype(np.float32)
    return token_ids, gold_logprobs


def dict_loop_preference(token_ids, gold_logprobs):
    """The reference code's aggregation: per-token lists filled in a Python loop, then per-token means.

    Returns {token id: mean log-prob under tower 0 minus mean log-prob under tower 1}.
    """
    logprobs_tower0 = collections.defaultdict(list)
    logprobs_tower1 = collections.defaultdict(list)
    for token_id, logprob0, logprob1 in zip(token_ids.tolist(), gold_logprobs[0].tolist(), gold_logprobs[1].tolist()):
        logprobs_tower0[token_id].append(logprob0)
        logprobs_tower1[token_id].append(logprob1)
    return {
        token_id: np.mean(logprobs_tower0[token_id]) - np.mean(logprobs_tower1[token_id])
        for token_id in logprobs_tower0
    }


def vectorized_preference(token_ids, gold_logprobs, batch_size):
    """PreferenceAccumulator fed in batches of batch_size predictions (None: one update), then compute()."""
    accumulator = PreferenceAccumulator()
    batch_size = batch_size or token_ids.shape[0]
    for start in range(0, token_ids.shape[0], batch_size):
        accumulator.update(token_ids[start : start + batch_size], gold_logprobs[:, start : start + batch_size])
    return accumulator.compute()


def best_time(repeats, function, *args):
    """The result and the fastest of `repeats` runs as (wall seconds, CPU seconds of this process).

    Both paths run on one core (numpy's sort and bincount are single-threaded), so on an idle machine the two
    agree; on a shared one, CPU time leaves out the time spent waiting for a core.
    """
    wall, cpu = [], []
    for _ in range(repeats):
        wall_start, cpu_start = time.perf_counter(), time.process_time()
        result = function(*args)
        wall.append(time.perf_counter() - wall_start)
        cpu.append(time.process_time() - cpu_start)
    return result, (min(wall), min(cpu))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_predictions", type=int, default=10_000_000, help="(token, log-probs) pairs to aggregate")
    parser.add_argument("--vocab_size", type=int, default=30_000)
    parser.add_argument(
        "--dict_loop_predictions", type=int, default=1_000_000, help="subsample the dict loop is timed on, then scaled"
    )
    parser.add_argument("--repeats", type=int, default=3, help="each method runs this often; the fastest run counts")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not 0 < args.dict_loop_predictions <= args.num_predictions:
        parser.error(
            f"--dict_loop_predictions must be in [1, {args.num_predictions}]; got {args.dict_loop_predictions}"
        )

    token_ids, gold_logprobs = make_predictions(args.num_predictions, args.vocab_size, args.seed)
    subsample = slice(0, args.dict_loop_predictions)

    # same per-type preferences on the subsample, so the two timings measure the same result
    loop_preference, loop_seconds = best_time(
        args.repeats, dict_loop_preference, token_ids[subsample], gold_logprobs[:, subsample]
    )
    check = vectorized_preference(token_ids[subsample], gold_logprobs[:, subsample], None)
    loop_values = [loop_preference[token_id] for token_id in check.token_ids.tolist()]
    np.testing.assert_allclose(check.preference_nats[0], loop_values, atol=1e-9)

    _, one_shot_seconds = best_time(args.repeats, vectorized_preference, token_ids, gold_logprobs, None)
    _, batched_seconds = best_time(args.repeats, vectorized_preference, token_ids, gold_logprobs, BATCH_PREDICTIONS)
    scale = args.num_predictions / args.dict_loop_predictions
    loop_seconds_full = tuple(seconds * scale for seconds in loop_seconds)

    print(
        f"{args.num_predictions:,} predictions, vocabulary {args.vocab_size:,} (Zipf), 2 towers, "
        f"fastest of {args.repeats} runs"
    )
    scaled = ""
    if args.dict_loop_predictions < args.num_predictions:
        scaled = f" (timed on {args.dict_loop_predictions:,}, scaled)"
    rows = [
        (f"python dict loop{scaled}", loop_seconds_full),
        ("PreferenceAccumulator, one update", one_shot_seconds),
        (f"PreferenceAccumulator, batches of {BATCH_PREDICTIONS:,}", batched_seconds),
    ]
    print(f"{'method':<56} {'wall s':>7} {'CPU s':>7} {'M predictions/CPU s':>20} {'speed-up (CPU)':>15}")
    for name, (wall, cpu) in rows:
        rate = args.num_predictions / cpu / 1e6
        print(f"{name:<56} {wall:>7.2f} {cpu:>7.2f} {rate:>20.2f} {loop_seconds_full[1] / cpu:>14.1f}x")


if __name__ == "__main__":
    main()
