"""Validation loss and perplexity of the joint model and, in the probe phase, of each probe."""

import math

import torch
from torch.nn import functional as F

from .objectives import objective_of, predicting_positions, prediction_targets


@torch.no_grad()
def evaluate(
    accelerator,
    model,
    eval_dataloader,
    probe_model=None,
    probe_chunk_size: int | None = None,
    joint_metrics: dict | None = None,
) -> dict:
    """
    Token-weighted mean loss of the model's objective (next token, or masked tokens) over the whole validation
    set (exact under sharding: per-sequence sums go through gather_for_metrics, which drops the padding samples
    of the last batch).

    Returns {"loss", "perplexity"} of the joint model, plus "probe_{i}_loss" / "probe_{i}_perplexity" for each
    tower's probe when `probe_model` (the unwrapped model holding the probes) is given. In the probe phase the
    joint model is frozen: pass its `joint_metrics` from an earlier evaluation and only the probes are evaluated.
    """
    if joint_metrics is not None and probe_model is None:
        raise ValueError("`joint_metrics` replaces the joint model's evaluation only when probes are evaluated.")
    model.eval()
    objective = objective_of(accelerator.unwrap_model(model).config)
    totals = None
    for batch in eval_dataloader:
        targets = prediction_targets(batch["labels"], objective)  # [batch, seq - shift]
        columns = [targets.ne(-100).sum(-1)]  # tokens, then each NLL sum: [batch] each
        with accelerator.autocast():
            if probe_model is None:
                logits = model(input_ids=batch["input_ids"]).logits
            else:  # one pass of the frozen towers serves the joint model and the probes
                features = probe_model.probe_features(batch["input_ids"])
                logits = probe_model.logits_from_probe_features(features) if joint_metrics is None else None
                features = predicting_positions(features, objective, seq_dim=2)
                gold_logprobs = probe_model.probes(features, targets, probe_chunk_size)  # [towers, batch, seq - shift]
        if logits is not None:
            logits = predicting_positions(logits, objective, seq_dim=1)
            nll = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="none", ignore_index=-100)
            columns.append(nll.view(targets.shape).sum(-1))
        if probe_model is not None:
            columns.extend(-gold_logprobs.sum(-1))  # one probe's NLL per column
        sums = accelerator.gather_for_metrics(torch.stack(columns, dim=1).double()).sum(0)
        totals = sums if totals is None else totals + sums
    tokens, *nll_sums = totals.tolist()
    names = [] if joint_metrics is not None else ["loss"]
    names += [f"probe_{index}_loss" for index in range(len(nll_sums) - len(names))]
    metrics = {name: joint_metrics[name] for name in ("loss", "perplexity")} if joint_metrics is not None else {}
    for name, nll_sum in zip(names, nll_sums):
        metrics[name] = nll_sum / tokens
        metrics[name.replace("loss", "perplexity")] = math.exp(min(nll_sum / tokens, 700.0))  # exp overflows past ~709
    return metrics


def format_metrics(metrics: dict) -> str:
    """One line: the joint model's loss and perplexity, then each probe's next to it."""
    parts = [f"joint model loss {metrics['loss']:.4f} ppl {metrics['perplexity']:.2f}"]
    probe = 0
    while f"probe_{probe}_loss" in metrics:
        parts.append(
            f"probe {probe} loss {metrics[f'probe_{probe}_loss']:.4f} ppl {metrics[f'probe_{probe}_perplexity']:.2f}"
        )
        probe += 1
    return " | ".join(parts)
