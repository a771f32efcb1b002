"""Benchmark: one probe epoch with the frozen towers run at every step (the old path) vs on cached features.

Before caching, every probe step ran the frozen towers over its blocks (forward only) and then the probes
(forward, backward, AdamW). Now the probe phase runs the towers once over the data and each step trains only the
probes on cached positions. This script times one epoch of both paths side by side, on the tiny recipe's model
(2 x (2 layers, width 64), vocabulary 4096, 16 blocks of 128 tokens per step), causal and masked, with 1 and 2
probes per tower; the paths alternate within every repeat, so both see the same machine load. The one-off cost of
building the cache is reported on its own: it is what the cached path pays once per run instead of every epoch.

    python benchmarks/bench_probe_epoch.py                       # 256 blocks (16 steps) per epoch, 3 repeats
    python benchmarks/bench_probe_epoch.py --blocks 512 --repeats 5

The models are untrained (timing does not depend on the weights); the text is WikiText-2 with a byte-level BPE of
4096 tokens (with <mask>) trained on its first megabyte.
"""

import argparse
import math
import statistics
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from transformers import get_scheduler

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.towers_transformer import TwoTowerTransformerTowers
from twotower.training.arguments import TwoTowerTrainingConfig
from twotower.training.data.blocks import load_raw_datasets, tokenize_and_group
from twotower.training.data.objectives import make_collators, predicting_positions, prediction_targets
from twotower.training.optim.optimization import train_step
from twotower.training.phases import make_phase
from twotower.training.phases.replica_sampling import replica_orders, step_positions
from twotower.training.feature_cache.probe_cache import build_feature_cache
from twotower.training.data.tokenizer import padded_vocab_size, train_bpe_tokenizer

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2" / "train.txt"
BLOCK_SIZE = 128  # the tiny recipe's
BATCH_BLOCKS = 16  # the tiny recipe's per_device_train_batch_size
TOKENIZER_TEXT_BYTES = 1_000_000
MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}


def wikitext_blocks(num_blocks: int):
    """(tokenizer, the first `num_blocks` blocks of WikiText-2 train as a datasets.Dataset)."""
    text = WIKITEXT.read_text(encoding="utf-8")[:TOKENIZER_TEXT_BYTES].splitlines()
    tokenizer = train_bpe_tokenizer(iter([text]), 4096, masked=True)
    blocks = tokenize_and_group(load_raw_datasets("unused", None, str(WIKITEXT)), tokenizer, BLOCK_SIZE)["train"]
    return tokenizer, blocks.select(range(num_blocks))


def probe_setup(objective: str, replicas: int, tokenizer, accelerator):
    """A tiny frozen model with new probes, and what a probe run trains: (model, trained, optimizer, scheduler)."""
    config = TwoTowerTrainingConfig(phase="probe", pretrained_model="unused", probe_replicas=replicas, cpu=True)
    torch.manual_seed(0)
    model = MODEL_CLASSES[objective](TwoTowerConfig.from_preset("tiny", vocab_size=padded_vocab_size(tokenizer)))
    model.reset_probes(replicas)
    phase = make_phase(config)
    trained = phase.trained_module(model, accelerator.device)
    optimizer = phase.make_optimizer(trained)
    scheduler = get_scheduler("constant", optimizer)
    return config, model, trained, optimizer, scheduler


def epoch_on_blocks(accelerator, trained, optimizer, scheduler, model, loader, objective: str) -> float:
    """The old path: every step runs the frozen towers over its blocks, then trains the probes. Returns seconds."""
    probes = trained.probes

    def loss_function(batch, num_items):
        with torch.no_grad():
            features = predicting_positions(model.probe_features(batch["input_ids"]), objective, seq_dim=2)
        targets = prediction_targets(batch["labels"], objective)  # [batch, seq - shift]
        return -probes(features, targets).sum() / num_items

    start = time.perf_counter()
    for batch in loader:
        train_step(accelerator, trained, [batch], loss_function, optimizer, scheduler, 1.0, objective)
    return time.perf_counter() - start


def epoch_on_cache(accelerator, trained, optimizer, scheduler, config, cache, objective: str, epoch: int) -> float:
    """The cached path: each step trains the probes on its replicas' cached positions. Returns seconds."""
    loss_function = make_phase(config).loss_function(trained)
    positions_per_step = round(BATCH_BLOCKS * len(cache) / cache.num_blocks)  # a step of blocks' positions
    steps = math.ceil(len(cache) / positions_per_step)

    start = time.perf_counter()
    orders = replica_orders(0, epoch, config.probe_replicas, cache.num_blocks)  # the training's block order
    for step in range(steps):
        batch = cache.replica_batch(step_positions(orders, step, steps, positions_per_step, cache.block_starts))
        train_step(accelerator, trained, [batch], loss_function, optimizer, scheduler, 1.0, objective)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=256, help="blocks per epoch (16 per step)")
    parser.add_argument("--repeats", type=int, default=3, help="epochs timed per path; the median is reported")
    args = parser.parse_args()

    accelerator = Accelerator(cpu=True)
    tokenizer, blocks = wikitext_blocks(args.blocks)
    print(f"{args.blocks} blocks of {BLOCK_SIZE} tokens per epoch, {BATCH_BLOCKS} blocks per step, "
          f"{torch.get_num_threads()} threads, medians of {args.repeats} epochs")
    print("| objective | probes per tower | positions per epoch | towers + probes every step (s/epoch) | "
          "cached (s/epoch) | speed-up | building the cache (s, once) |")
    print("|---|---|---|---|---|---|---|")
    for objective in ("causal", "masked"):
        train_collator, _ = make_collators(objective, TwoTowerTransformerTowers, tokenizer, 0.15, seed=0)
        loader = torch.utils.data.DataLoader(blocks.with_format("torch"), batch_size=BATCH_BLOCKS,
                                             collate_fn=train_collator)  # fmt: skip
        for replicas in (1, 2):
            config, model, trained, optimizer, scheduler = probe_setup(objective, replicas, tokenizer, accelerator)
            start = time.perf_counter()
            cache = build_feature_cache(accelerator, model, blocks, train_collator, objective, batch_size=32)
            cache_seconds = time.perf_counter() - start
            before, after = [], []
            setup = (accelerator, trained, optimizer, scheduler)
            for repeat in range(args.repeats + 1):  # the first round warms up
                before.append(epoch_on_blocks(*setup, model, loader, objective))
                after.append(epoch_on_cache(*setup, config, cache, objective, repeat))
            before, after = statistics.median(before[1:]), statistics.median(after[1:])
            print(f"| {objective} | {replicas} | {len(cache)} | {before:.2f} | {after:.2f} | {before / after:.2f}x | "
                  f"{cache_seconds:.2f} |")


if __name__ == "__main__":
    main()
