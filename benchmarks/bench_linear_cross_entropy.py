"""Benchmark: the decoder and its cross-entropy, forward and backward, with logits against without (`skip_logits`).

Times the vocabulary projection plus loss of a training step as transformers' LM heads compute it (`nn.Linear`, then
`fixed_cross_entropy` over the [tokens, vocab] logits) and as `linear_cross_entropy` does (pieces of rows, gradients
with the loss), interleaved in rounds, and prints each one's milliseconds, their ratio and each one's peak memory.

    python -m benchmarks.bench_linear_cross_entropy --num_threads 1    # the speed benchmark's size: 16 x 128 tokens
    python -m benchmarks.bench_linear_cross_entropy --num_threads 1 --vocab_size 50257 --piece_rows 8 32 64 128 256

`--piece_rows` also times `linear_cross_entropy` at each given piece size, beside the rule's (`piece_rows`);
`--torch_chunked` also times torch's own `F.linear_cross_entropy` with its chunking (`LinearCrossEntropyOptions()`);
`--compiled` also times the logits' loss and `linear_cross_entropy` under `torch.compile`. `--device cuda
--precision bf16` times a GPU's shapes as its training runs them (bf16 autocast, float32 hidden states):

    python -m benchmarks.bench_linear_cross_entropy --device cuda --precision bf16 --tokens 8192 --hidden_size 768 \
        --vocab_size 50257 --piece_rows 512 1024 2048 4096 8192
"""

import argparse

import torch
from torch.nn import functional as F
from transformers.loss.loss_utils import fixed_cross_entropy

from benchmarks.bench_speed import resolve_device
from benchmarks.measure import peak_memory_bytes, time_interleaved
from benchmarks.workloads import PRECISIONS, Setting, precision_context, why_unsupported
from modeling_twotower.linear_cross_entropy import LinearCrossEntropy, linear_cross_entropy, piece_rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16 * 128, help="positions per step (micro-batch x sequence)")
    parser.add_argument("--hidden_size", type=int, default=128, help="the decoder's input width")
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=6, help="timed calls of each, spread over --rounds")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num_threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--piece_rows", type=int, nargs="*", default=[], help="also time these piece sizes (rows)")
    parser.add_argument("--torch_chunked", action="store_true", help="also time torch's chunked F.linear_cross_entropy")
    parser.add_argument("--compiled", action="store_true", help="also time both losses under torch.compile")
    parser.add_argument("--device", default="auto", help="auto (the accelerator if there is one) | cpu | cuda | ...")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS,
                        help="fp32, or autocast to bf16 / fp16 over float32 inputs as mixed-precision training runs")
    return parser.parse_args(argv)


def logits_loss(hidden, weight, bias, targets):
    """transformers' LM head and loss: the [tokens, vocab] logits, then cross-entropy over them."""
    return fixed_cross_entropy(F.linear(hidden, weight, bias), targets)


def run(args) -> dict:
    """{"with_logits", "without_logits"}: (ms per forward + backward, peak bytes), and "ratio" of their times."""
    device, setting = resolve_device(args.device), Setting(precision=args.precision)
    unsupported = why_unsupported(setting, device)
    if unsupported:
        raise ValueError(f"--precision {args.precision} cannot run on {device}: {unsupported}.")
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden_size, generator=generator).to(device).requires_grad_()
    decoder = torch.nn.Linear(args.hidden_size, args.vocab_size, device=device)
    targets = torch.randint(0, args.vocab_size, (args.tokens,), generator=generator).to(device)
    steps = {
        "with_logits": lambda: logits_loss(hidden, decoder.weight, decoder.bias, targets),
        "without_logits": lambda: linear_cross_entropy(hidden, decoder.weight, decoder.bias, targets),
    }
    if args.compiled:
        for name, loss in (("with_logits", logits_loss), ("without_logits", linear_cross_entropy)):
            compiled = torch.compile(loss)
            steps[f"{name}_compiled"] = lambda loss=compiled: loss(hidden, decoder.weight, decoder.bias, targets)
    for rows in args.piece_rows:
        steps[f"{rows}_rows"] = lambda rows=rows: LinearCrossEntropy.apply(
            hidden, decoder.weight, decoder.bias, targets, args.tokens, rows
        )
    if args.torch_chunked:
        steps["torch_chunked"] = lambda: F.linear_cross_entropy(
            hidden, decoder.weight, targets, linear_bias=decoder.bias, options=torch.nn.LinearCrossEntropyOptions()
        )

    def forward_and_backward(loss):
        with precision_context(setting, device):
            value = loss()
        value.backward()

    calls = {name: (lambda loss=loss: forward_and_backward(loss)) for name, loss in steps.items()}
    timings = time_interleaved(calls, device, warmup=1, repeats=args.repeats, rounds=args.rounds)
    live = [hidden, hidden.grad, *decoder.parameters(), decoder.weight.grad, decoder.bias.grad, targets]  # after warm-up
    result = {
        name: (1000 * timings[name].median_s, peak_memory_bytes(call, device, live)) for name, call in calls.items()
    }
    return result | {"ratio": result["with_logits"][0] / result["without_logits"][0]}


def main(argv=None):
    args = parse_args(argv)
    result = run(args)
    rule_rows = piece_rows(args.tokens, args.hidden_size, args.vocab_size)
    device = resolve_device(args.device)
    where = f"{torch.get_num_threads()} threads" if device.type == "cpu" else str(device)
    print(f"decoder + cross-entropy, forward and backward: {args.tokens} positions, width {args.hidden_size}, "
          f"vocabulary {args.vocab_size}, {args.precision}, {where} (without logits: pieces of {rule_rows} rows):")
    for name in [name for name in result if name != "ratio"]:
        ms, peak = result[name]
        print(f"  {name:24s} {ms:8.1f} ms   peak memory {peak / 2**20:6.1f} MiB (inputs, weights, gradients included)")
    print(f"  without logits: {result['ratio']:.2f}x the logits' speed")
    return result


if __name__ == "__main__":
    main()
