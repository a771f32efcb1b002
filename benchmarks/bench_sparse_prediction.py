"""Benchmark: a masked LM's training step with the LM head on every position (dense) vs on the masked ones only
(`sparse_prediction`, ModernBERT's option), side by side.

At the tiny preset's width (2 towers of 2 layers, width 64) the head's vocabulary projection (4096 tokens) and its
float32 cross-entropy cost more than the towers; BERT-style masking labels 15% of the positions, so the sparse head
skips most of that work and computes the same loss. This script times full training steps (forward, backward,
AdamW) of the cooperative model and of the independent-towers control, both ways, on one random batch of the
study's shape (16 blocks of 128 tokens, 15% labelled), in interleaved rounds so that both see the same machine load.

    python -m benchmarks.bench_sparse_prediction                 # 20 timed steps per model, 4 rounds
    python -m benchmarks.bench_sparse_prediction --repeats 40 --num_threads 1
"""

import argparse

import torch

from benchmarks.measure import time_interleaved
from modeling_twotower import TwoTowerConfig, TwoTowerForMaskedLM

VOCAB_SIZE, BATCH_BLOCKS, BLOCK_SIZE, MLM_PROBABILITY = 4096, 16, 128, 0.15  # the study's masked family


def masked_batch(seed: int = 0) -> tuple[torch.LongTensor, torch.LongTensor]:
    """(input_ids with the labelled positions replaced by a mask id, labels: original ids there, -100 elsewhere)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB_SIZE, (BATCH_BLOCKS, BLOCK_SIZE), generator=generator)
    labelled = torch.rand(ids.shape, generator=generator) < MLM_PROBABILITY
    return ids.masked_fill(labelled, 0), ids.masked_fill(~labelled, -100)


class MaskedTrainingStep:
    """One AdamW step of a masked LM on a fixed batch; returns the loss."""

    def __init__(self, model, input_ids, labels):
        self.model, self.input_ids, self.labels = model.train(), input_ids, labels
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def __call__(self) -> float:
        loss = self.model(input_ids=self.input_ids, labels=self.labels).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=20, help="timed steps per model; the median is reported")
    parser.add_argument("--rounds", type=int, default=4, help="rounds the timed steps are spread over")
    parser.add_argument("--num_threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)

    input_ids, labels = masked_batch()
    print(f"tiny preset, vocabulary {VOCAB_SIZE}, {BATCH_BLOCKS} x {BLOCK_SIZE} tokens per step, "
          f"{int((labels != -100).sum())} labelled; {torch.get_num_threads()} threads, medians of {args.repeats} steps")
    print("| model | dense head (s/step) | sparse head (s/step) | speed-up | first losses equal |")
    print("|---|---|---|---|---|")
    for name, cooperative in (("cooperative", True), ("independent-towers control", False)):
        steps = {}
        for sparse in (False, True):
            torch.manual_seed(0)
            config = TwoTowerConfig.from_preset(
                "tiny", vocab_size=VOCAB_SIZE, cooperative=cooperative, sparse_prediction=sparse,
                hidden_dropout=0.0, attention_dropout=0.0,  # equal first losses: no dropout draws
            )
            steps[sparse] = MaskedTrainingStep(TwoTowerForMaskedLM(config), input_ids, labels)
        losses_equal = abs(steps[False]() - steps[True]()) < 1e-4  # the same weights, before any update
        timings = time_interleaved({"dense": steps[False], "sparse": steps[True]}, torch.device("cpu"),
                                   warmup=2, repeats=args.repeats, rounds=args.rounds)  # fmt: skip
        dense, sparse = timings["dense"].median_s, timings["sparse"].median_s
        print(f"| {name} | {dense:.3f} | {sparse:.3f} | {dense / sparse:.2f}x | {losses_equal} |")


if __name__ == "__main__":
    main()
