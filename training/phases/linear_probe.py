"""The probe phase with `--probe_type linear`: each probe solved by full-batch L-BFGS, an iteration a step."""

import torch
from torch import nn

from ..optim.linear_probes import LBFGS_HISTORY, check_linear_probes_fit, lbfgs_step, make_lbfgs
from ..feature_cache.probe_cache import cache_both_splits
from .probe import ProbePhase


class LinearProbePhase(ProbePhase):
    """Linear probes of a frozen model by L-BFGS on the cached features of the whole training split."""

    checkpoints_every_epoch = False  # an epoch is one iteration: checkpoint every --checkpointing_steps only
    lr_scheduler_type = "constant"  # L-BFGS sizes its steps by line search, at lr 1

    data_order = "full batch: every probe read every cached position at every L-BFGS iteration"

    def check_accelerator(self, accelerator) -> None:
        """As the MLP probes', and L-BFGS needs whole gradients and no fp16 loss scaling."""
        super().check_accelerator(accelerator)
        check_linear_probes_fit(accelerator)

    def make_optimizer(self, trained: nn.Module) -> torch.optim.Optimizer:
        self.optimizer = make_lbfgs(trained, self.config.probe_tolerance)
        return self.optimizer

    @property
    def optimizer_state_copies(self) -> int:
        """L-BFGS's history of LBFGS_HISTORY pairs of copies, and 2 more (the last gradient and direction)."""
        return 2 * LBFGS_HISTORY + 2

    @property
    def optimizer_description(self) -> str:
        config = self.config
        return (
            f"L-BFGS (strong-Wolfe line search, history {LBFGS_HISTORY}, lr 1, no schedule), one iteration a step on "
            f"the full batch, L2 penalty {config.probe_l2:g} on weights and biases, stopping when no gradient entry "
            f"exceeds {config.probe_tolerance:g}"
        )

    def build_data(self, accelerator, model, lm_datasets, collators, objective: str) -> tuple[int, int]:
        """The frozen towers' features of both splits; an epoch is one step on the full batch."""
        self.caches = cache_both_splits(accelerator, model, lm_datasets, collators, objective, self.config)
        self.steps_per_epoch = 1
        return 1, 1

    def epoch_windows(self, run, epoch: int, units_to_skip: int):
        if not units_to_skip:
            yield [self.caches["train"]]

    def optimizer_step(self, run, window) -> tuple[float, float | None, int]:
        """One L-BFGS iteration: (objective, largest gradient entry, positions scored)."""
        return lbfgs_step(run.accelerator, run.trained, window[0], self.optimizer, run.lr_scheduler,
                          self.config.probe_l2, self.eval_chunk)

    def converged(self, loss: float, grad_norm, train_losses: list) -> bool:
        """At the tolerance L-BFGS does not move; a loss that did not fall is float32's floor."""
        return grad_norm <= self.config.probe_tolerance or bool(train_losses) and loss >= train_losses[-1]

    def report_end(self, run, outcome) -> None:
        """How L-BFGS ended: at the tolerance, at float32's floor, or out of steps."""
        if not outcome.train_losses:
            return
        tolerance, grad_norm = self.config.probe_tolerance, outcome.grad_norm
        result = "converged" if grad_norm <= tolerance else "not converged; raise --max_train_steps"
        if outcome.converged and grad_norm > tolerance:
            result = "stopped: the objective no longer falls in float32"
        run.accelerator.print(f"L-BFGS after {outcome.completed_steps} steps, largest gradient entry {grad_norm:.2e} "
                              f"(tolerance {tolerance:g}): {result}")
