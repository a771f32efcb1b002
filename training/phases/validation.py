"""Validation loss and perplexity of the joint model and, in the probe phase, of each tower's probes."""

import math

import torch
from torch.nn import functional as F


def perplexity(mean_nll: float) -> float:
    """exp(mean NLL), capped where exp would overflow (past ~709)."""
    return math.exp(min(mean_nll, 700.0))


def loss_and_perplexity(name: str, nll_sum: float, tokens: float) -> dict:
    """{name: mean NLL, name with loss -> perplexity: its exp}."""
    return {name: nll_sum / tokens, name.replace("loss", "perplexity"): perplexity(nll_sum / tokens)}


@torch.no_grad()
def evaluate_blocks(accelerator, model, eval_dataloader) -> dict:
    """
    {"loss", "perplexity"}: token-weighted mean loss of the model's objective (next token, or masked tokens) over
    the whole validation set (exact under sharding: per-sequence sums go through gather_for_metrics, which drops
    the padding samples of the last batch).
    """
    model.eval()
    unwrapped = accelerator.unwrap_model(model)
    totals = None
    for batch in eval_dataloader:
        targets = unwrapped.prediction_targets(batch["labels"])  # [batch, seq - shift]
        with accelerator.autocast():
            # sentence-pair blocks carry an attention_mask: no position attends to the padding
            outputs = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
            logits = unwrapped.predicting_positions(outputs.logits, seq_dim=1)
        nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none", ignore_index=-100)
        sums = torch.stack([targets.ne(-100).sum(-1), nll.view(targets.shape).sum(-1)], dim=1).double()  # [batch, 2]
        sums = accelerator.gather_for_metrics(sums).sum(0)
        totals = sums if totals is None else totals + sums
    tokens, nll_sum = totals.tolist()
    return loss_and_perplexity("loss", nll_sum, tokens)


@torch.no_grad()
def evaluate_cached(
    accelerator, model, cache, chunk_positions: int, probe_chunk_size: int | None = None,
    joint_metrics: dict | None = None,
) -> dict:
    """
    Metrics of the probes of `model` (unwrapped) on the validation positions of every process (each holds a disjoint
    share, so the sums are exact): of a FeatureCache, in chunks of `chunk_positions`, or of FrozenTowerFeatures
    (--probe_feature_cache none), recomputed a batch of blocks at a time at every evaluation.

    Returns "probe_{t}_loss" / "probe_{t}_perplexity" per tower (the mean NLL over its replicas), with more than one
    replica also "probe_{t}_replica_{r}_loss" / "..._perplexity", and the joint model's "loss" / "perplexity". The
    joint model is frozen in the probe phase: pass its `joint_metrics` from an earlier evaluation to reuse them.
    """
    num_towers, num_replicas = model.config.num_towers, model.probes.num_replicas
    probe_sums = torch.zeros(model.probes.num_probes, dtype=torch.float64, device=accelerator.device)
    joint_sum = torch.zeros((), dtype=torch.float64, device=accelerator.device)
    for features, targets in cache.chunks(chunk_positions):  # [towers, n, hidden], [n]
        with accelerator.autocast():
            probe_sums -= model.probes.score_positions(features, targets, probe_chunk_size).sum(-1).double()
            if joint_metrics is None:
                logits = model.joint_logits(features.unsqueeze(1))[0]  # [n, vocab]
        if joint_metrics is None:
            joint_sum += F.cross_entropy(logits.float(), targets, reduction="sum").double()
    tokens = torch.tensor([len(cache)], dtype=torch.float64, device=accelerator.device)
    totals = accelerator.reduce(torch.cat([tokens, joint_sum.view(1), probe_sums]), "sum")
    tokens, joint_sum, *probe_sums = totals.tolist()

    metrics = dict(joint_metrics) if joint_metrics is not None else loss_and_perplexity("loss", joint_sum, tokens)
    for tower in range(num_towers):
        replica_sums = probe_sums[tower * num_replicas : (tower + 1) * num_replicas]
        metrics |= loss_and_perplexity(f"probe_{tower}_loss", sum(replica_sums) / num_replicas, tokens)
        if num_replicas > 1:
            for replica, nll_sum in enumerate(replica_sums):
                metrics |= loss_and_perplexity(f"probe_{tower}_replica_{replica}_loss", nll_sum, tokens)
    return metrics


def format_metrics(metrics: dict) -> str:
    """One line: the joint model's loss and perplexity, then each tower's probes (and their replicas) next to it."""
    parts = [f"joint model loss {metrics['loss']:.4f} ppl {metrics['perplexity']:.2f}"]
    tower = 0
    while f"probe_{tower}_loss" in metrics:
        part = f"probe {tower} loss {metrics[f'probe_{tower}_loss']:.4f} ppl {metrics[f'probe_{tower}_perplexity']:.2f}"
        replicas = []
        while f"probe_{tower}_replica_{len(replicas)}_loss" in metrics:
            replicas.append(f"{metrics[f'probe_{tower}_replica_{len(replicas)}_loss']:.4f}")
        parts.append(part + (f" (replicas {', '.join(replicas)})" if replicas else ""))
        tower += 1
    return " | ".join(parts)
