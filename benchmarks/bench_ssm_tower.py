"""
Training tokens/s of the state-space towers (`tower_type="ssm"`) next to the transformer towers at equal parameters
(the tiny and tiny_ssm recipes' models), interleaved step by step so that both see the same machine load; and what
batching the towers could gain: the two towers' mixers run one after the other, against one mixer on both towers'
batches at once (shared weights: the most a batched kernel could save).

    python -m benchmarks.bench_ssm_tower --repeats 3 --batch_size 4 --num_threads 1
"""

import argparse
import statistics
import time

import torch

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM

VOCAB = 4096  # the tiny recipes' tokenizer
MODELS = {"transformer": {}, "ssm": {"tower_type": "ssm", "intermediate_size": 192}}


def build(name: str) -> TwoTowerForCausalLM:
    torch.manual_seed(0)
    return TwoTowerForCausalLM(TwoTowerConfig.from_preset("tiny", vocab_size=VOCAB, **MODELS[name])).train()


def step_seconds(model, optimizer, input_ids) -> float:
    start = time.perf_counter()
    model(input_ids, labels=input_ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - start


def mixer_seconds(mixers, inputs, together: bool) -> float:
    start = time.perf_counter()
    if together:  # one mixer over both towers' batches
        mixers[0](torch.cat(list(inputs))).sum().backward()
    else:
        sum(mixer(tower_inputs).sum() for mixer, tower_inputs in zip(mixers, inputs)).backward()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="timed steps of each model per repeat")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--block_size", type=int, default=128)
    parser.add_argument("--num_threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.num_threads)
    models = {name: build(name) for name in MODELS}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-3) for name, model in models.items()}
    input_ids = torch.randint(0, VOCAB, (args.batch_size, args.block_size), generator=torch.Generator().manual_seed(1))
    for name, model in models.items():
        print(f"{name}: {model.num_parameters(exclude_embeddings=True) / 1e3:.1f}k non-embedding parameters, "
              f"{sum(p.numel() for p in model.model.towers.parameters()) / 1e3:.1f}k in the towers")
        step_seconds(model, optimizers[name], input_ids)  # warm-up
    tokens = args.steps * args.batch_size * args.block_size
    ratios = []
    for repeat in range(args.repeats):
        rates = {}
        for name in MODELS:  # interleaved: each repeat times both models back to back
            seconds = sum(step_seconds(models[name], optimizers[name], input_ids) for _ in range(args.steps))
            rates[name] = tokens / seconds
        ratios.append(rates["ssm"] / rates["transformer"])
        print(f"repeat {repeat}: transformer {rates['transformer']:.0f} tokens/s, ssm {rates['ssm']:.0f} tokens/s, "
              f"ratio {ratios[-1]:.3f}")
    print(f"ssm / transformer training tokens/s: median {statistics.median(ratios):.3f} over {args.repeats} repeats")

    blocks = models["ssm"].model.towers.forward_blocks
    mixers = [tower[0].mixer for tower in blocks]
    inputs = torch.randn(len(mixers), args.batch_size, args.block_size, 64)
    looped = [mixer_seconds(mixers, inputs, together=False) for _ in range(args.repeats)]
    together = [mixer_seconds(mixers, inputs, together=True) for _ in range(args.repeats)]
    print(f"one layer of both towers, forward + backward: one after the other {statistics.median(looped):.3f} s, "
          f"one mixer over both batches {statistics.median(together):.3f} s")


if __name__ == "__main__":
    main()
