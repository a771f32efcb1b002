"""The masked family's learning curve against transformers' own BERT, side by side.

The study's masked towers (2 x (2 layers, width 64), 15% masking) stay far above what a causal model of the same
size reaches. This script trains `BertForMaskedLM` (width 128, 2 layers, 4 heads) and the study's two-tower masked
LM on the same batches of WikiText-2 blocks, with the same masks (the training collator), tokenizer, optimiser
(AdamW 1e-3, betas 0.9/0.98, weight decay 0.01 on matrices, linear warm-up and decay) and gradient clipping, and
prints both validation masked-token losses every `--eval_steps`: equal curves say the slow learning is BERT-style
masking's at this size, not this package's. Each loss is also given with the validation blocks' positions shuffled
(one fixed permutation of `position_ids`): a small gap says the model predicts a masked token mostly from which
tokens surround it, not from their order. Before training it prints what count models score at the same masked
positions (counts from the training blocks, Witten-Bell smoothing, nothing tuned): the add-one unigram, the masked
input's left neighbour, its right neighbour, and both neighbours: what reading the neighbours in order is worth at
least.

Each block is masked the same way every time it is drawn (the collator's epoch-0 masks). `--models two-tower` trains
one of the two, `--lr_scheduler_type` any transformers schedule (`constant_with_warmup` holds the peak rate), and
`--block_size` shorter blocks (the same tokens a step and per evaluation: 16 x 128 / block_size blocks a step).

    python -m benchmarks.masked_lm_baseline --tokenizer outputs/tiny-masked/tokenizer --max_train_steps 2000
"""

import argparse
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F
from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast, get_scheduler

from modeling_twotower import TwoTowerConfig, TwoTowerForMaskedLM
from modeling_twotower.towers_transformer import TwoTowerTransformerTowers
from twotower.training.data.blocks import load_raw_datasets, tokenize_and_group
from twotower.training.data.objectives import make_collators
from twotower.training.data.tokenizer import padded_vocab_size

WIKITEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
BLOCK_SIZE, BATCH_TOKENS, EVAL_TOKENS, WARMUP_STEPS = 128, 16 * 128, 256 * 128, 50  # the tiny recipes'
MODEL_NAMES = ("BertForMaskedLM", "two-tower")


def build_models(vocab_size: int, pad_token_id: int, block_size: int = BLOCK_SIZE) -> dict:
    torch.manual_seed(0)
    bert = BertForMaskedLM(BertConfig(
        vocab_size=vocab_size, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512,
        max_position_embeddings=block_size, pad_token_id=pad_token_id,
    ))  # fmt: skip
    torch.manual_seed(0)
    two_tower = TwoTowerForMaskedLM(TwoTowerConfig.from_preset(
        "tiny", vocab_size=vocab_size, pad_token_id=pad_token_id, sparse_prediction=True,
        max_position_embeddings=block_size,
    ))  # fmt: skip
    return dict(zip(MODEL_NAMES, (bert, two_tower)))


def optimizer_and_schedule(model, max_train_steps: int, lr_scheduler_type: str = "linear"):
    matrices = [p for p in model.parameters() if p.ndim > 1]
    others = [p for p in model.parameters() if p.ndim <= 1]
    groups = [{"params": matrices, "weight_decay": 0.01}, {"params": others, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.98))
    return optimizer, get_scheduler(lr_scheduler_type, optimizer, WARMUP_STEPS, max_train_steps)


@torch.no_grad()
def masked_token_loss(model, batches, position_ids=None) -> float:
    model.eval()
    nll, tokens = 0.0, 0
    for batch in batches:
        logits = model(input_ids=batch["input_ids"], position_ids=position_ids).logits
        labels = batch["labels"]
        nll += F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="sum").item()
        tokens += int(labels.ne(-100).sum())
    return nll / tokens


def witten_bell(counts: Counter, context_totals: Counter, context_types: Counter, context, target, backoff: float):
    """P(target | context): (c(context, target) + T(context) backoff) / (c(context) + T(context)), T the types seen."""
    if context_totals[context] == 0:
        return backoff
    types = context_types[context]
    return (counts[(context, target)] + types * backoff) / (context_totals[context] + types)


def context_counts(pairs: list) -> tuple[Counter, Counter, Counter]:
    """((context, target) counts, per-context totals, per-context numbers of distinct targets)."""
    counts = Counter(pairs)
    totals, types = Counter(), Counter()
    for (context, _), count in counts.items():
        totals[context] += count
        types[context] += 1
    return counts, totals, types


def neighbour_count_losses(train_ids: np.ndarray, vocab_size: int, batches: list, mask_token_id: int) -> dict:
    """
    Mean masked-token loss (nats) of count models over `batches`' labelled positions, reading the masked input as
    the model does: a neighbour that is [MASK] or past the block's edge is unknown (the count model backs off).
    """
    unigram = (np.bincount(train_ids, minlength=vocab_size) + 1.0) / (len(train_ids) + vocab_size)
    left = context_counts(list(zip(train_ids[:-1].tolist(), train_ids[1:].tolist())))
    right = context_counts(list(zip(train_ids[1:].tolist(), train_ids[:-1].tolist())))
    both = context_counts(list(zip(zip(train_ids[:-2].tolist(), train_ids[2:].tolist()), train_ids[1:-1].tolist())))
    nll = Counter()
    tokens = 0
    for batch in batches:
        input_ids = F.pad(batch["input_ids"], (1, 1), value=mask_token_id).tolist()
        for row, column in batch["labels"].ne(-100).nonzero().tolist():
            target = int(batch["labels"][row, column])
            before, after = input_ids[row][column], input_ids[row][column + 2]  # padded: column + 1 is the target
            before, after = (None if t == mask_token_id else t for t in (before, after))
            p_left = witten_bell(*left, before, target, unigram[target])
            p_right = witten_bell(*right, after, target, unigram[target])
            p_both = witten_bell(*both, (before, after), target, (p_left + p_right) / 2)
            for name, p in (("unigram", unigram[target]), ("left", p_left), ("right", p_right), ("both", p_both)):
                nll[name] -= np.log(p)
            tokens += 1
    return {name: float(value / tokens) for name, value in nll.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="a masked run's saved tokenizer (with <mask> and <pad>)")
    parser.add_argument("--max_train_steps", type=int, default=2000)
    parser.add_argument("--eval_steps", type=int, default=250)
    parser.add_argument("--lr_scheduler_type", default="linear", help="a transformers.get_scheduler name")
    parser.add_argument("--models", nargs="+", choices=MODEL_NAMES, default=list(MODEL_NAMES), help="which to train")
    parser.add_argument("--block_size", type=int, default=BLOCK_SIZE, help=f"tokens a block, dividing {BLOCK_SIZE}")
    args = parser.parse_args()
    if args.block_size < 1 or BLOCK_SIZE % args.block_size:
        parser.error(f"--block_size {args.block_size} must divide {BLOCK_SIZE} (e.g. 32), to keep the tokens a step.")
    batch_blocks = BATCH_TOKENS // args.block_size

    tokenizer = PreTrainedTokenizerFast.from_pretrained(args.tokenizer)
    raw = load_raw_datasets("text", None, str(WIKITEXT / "train.txt"), str(WIKITEXT / "valid.txt"))
    blocks = tokenize_and_group(raw, tokenizer, args.block_size).with_format("torch")
    train_collator, validation_collator = make_collators("masked", TwoTowerTransformerTowers, tokenizer, 0.15, seed=42)
    validation = [
        validation_collator([blocks["validation"][i] for i in range(start, start + batch_blocks)])
        for start in range(0, EVAL_TOKENS // args.block_size, batch_blocks)
    ]
    train_ids = np.asarray(blocks["train"].with_format("numpy")["input_ids"][:]).reshape(-1)
    references = neighbour_count_losses(train_ids, len(tokenizer), validation, tokenizer.mask_token_id)
    print(
        "Count models at the same masked positions: unigram {unigram:.4f}, left neighbour {left:.4f}, right "
        "neighbour {right:.4f}, both neighbours {both:.4f} nats".format(**references)
    )
    models = {  # both built either way, so a model trained alone starts from the same weights
        name: model
        for name, model in build_models(padded_vocab_size(tokenizer), tokenizer.pad_token_id, args.block_size).items()
        if name in args.models
    }
    optimizers = {
        name: optimizer_and_schedule(model, args.max_train_steps, args.lr_scheduler_type)
        for name, model in models.items()
    }
    shuffled_positions = torch.randperm(args.block_size, generator=torch.Generator().manual_seed(1)).unsqueeze(0)
    order = torch.Generator().manual_seed(0)
    columns = [f"{name}{kind} (nats)" for name in models for kind in ("", ", shuffled positions")]
    print("| step | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for step in range(1, args.max_train_steps + 1):
        indices = torch.randint(len(blocks["train"]), (batch_blocks,), generator=order).tolist()
        batch = train_collator([blocks["train"][i] for i in indices])
        for name, model in models.items():
            model.train()
            model(input_ids=batch["input_ids"], labels=batch["labels"]).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer, scheduler = optimizers[name]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        if step % args.eval_steps == 0:
            losses = [
                masked_token_loss(model, validation, position_ids)
                for model in models.values()
                for position_ids in (None, shuffled_positions)
            ]
            print(f"| {step} | " + " | ".join(f"{loss:.4f}" for loss in losses) + " |", flush=True)


if __name__ == "__main__":
    main()
