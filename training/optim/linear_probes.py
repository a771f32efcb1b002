"""Linear probes: L2-regularised softmax regression on each tower's slice, solved by full-batch L-BFGS on the cache.

The objective of each probe is its mean NLL over every cached training position (of every process) plus
lambda/2 * ||W||^2 + lambda/2 * ||b||^2. It is strictly convex, with one optimum, so replicas started from
different weights end at the same probe, up to the tolerance: they measure the features, not the optimiser's
noise. The bias is penalised too: a token that never occurs as a target in the cache would otherwise have no
finite optimal bias (it falls for as long as L-BFGS runs, and positions that predict that token score ever
lower). One optimizer step is one L-BFGS iteration, so checkpoints, evaluations and `max_train_steps`
(iterations) work as for the mlp probes.
"""

import contextlib

import torch
from accelerate.utils import DistributedType

from ..feature_cache.probe_cache import process_counts

LBFGS_HISTORY = 10  # pairs of past steps L-BFGS keeps (scipy's default; torch's is 100)


def check_linear_probes_fit(accelerator) -> None:
    """L-BFGS needs the whole gradient on every process and a closure: DDP or one process, no fp16 loss scaling."""
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise ValueError(
            f"--probe_type linear runs L-BFGS on whole, DDP-synced gradients, not under "
            f"{accelerator.distributed_type}; launch with training/accelerate_configs/ddp.yaml or one process."
        )
    if accelerator.mixed_precision == "fp16":
        raise ValueError(
            "--probe_type linear cannot run L-BFGS under fp16 loss scaling (GradScaler takes no closure); use "
            "--mixed_precision bf16 or no."
        )


def make_lbfgs(trained: torch.nn.Module, tolerance: float) -> torch.optim.LBFGS:
    """
    One iteration per optimizer step; no move once no gradient entry exceeds `tolerance`. A history of 10 pairs
    (scipy's default) keeps 20 copies of the probes rather than torch's 200; the strong-Wolfe line search may take
    its default 25 evaluations after the one at the start of the iteration.
    """
    return torch.optim.LBFGS(
        trained.parameters(), lr=1.0, max_iter=1, max_eval=26, tolerance_grad=tolerance, tolerance_change=0.0,
        history_size=LBFGS_HISTORY, line_search_fn="strong_wolfe",
    )


def add_l2_penalty(trained, l2: float) -> torch.Tensor:
    """lambda/2 * the squared norm of every parameter (weights and biases); adds its gradient and returns it."""
    penalty = 0.0
    for param in trained.parameters():
        param.grad.add_(param.detach(), alpha=l2)
        penalty += l2 / 2 * param.detach().square().sum()
    return penalty


def lbfgs_step(accelerator, trained, cache, optimizer, lr_scheduler, l2: float, chunk_positions: int):
    """
    One L-BFGS iteration on the full batch: the sum over probes of each probe's mean NLL on every process's cached
    positions plus the L2 penalty. The closure accumulates loss and gradient over chunks of the cache and syncs the
    gradient over processes once (DDP), so every process takes the same step. Returns (objective and largest
    gradient entry at the iteration's start, positions scored over all evaluations); L-BFGS does not move when
    that entry is within its tolerance.
    """
    num_positions = sum(process_counts(accelerator, len(cache)))
    starts = range(0, len(cache), chunk_positions)
    evaluations = []

    def closure():
        optimizer.zero_grad()
        nll = 0.0
        for index, start in enumerate(starts):
            features, targets = cache.chunk(start, start + chunk_positions)  # [towers, n, hidden], [n]
            with contextlib.nullcontext() if index == len(starts) - 1 else accelerator.no_sync(trained):
                with accelerator.autocast():
                    loss = -trained(features, targets).sum() / num_positions
                accelerator.backward(loss * accelerator.gradient_accumulation_steps * accelerator.num_processes)
            nll += loss.detach().double()  # float64: the line search compares values that differ in the 7th digit
        objective = accelerator.reduce(nll, "sum") + add_l2_penalty(trained, l2)
        evaluations.append((objective.item(), max(param.grad.abs().max().item() for param in trained.parameters())))
        return objective

    optimizer.step(closure)
    lr_scheduler.step()
    objective, largest_gradient = evaluations[0]
    return objective, largest_gradient, len(evaluations) * num_positions


