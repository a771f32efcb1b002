"""Early stopping on the validation loss: keep the best evaluation's weights, stop after `patience` without gain."""

import math
from collections.abc import Callable


def copy_to_cpu(state_dict: dict) -> dict:
    """A CPU copy of a state dict, in which tensors that shared memory (tied weights) still share one copy."""
    copies, by_memory = {}, {}
    for name, tensor in state_dict.items():
        memory = (tensor.device, tensor.data_ptr(), tensor.dtype, tensor.shape, tensor.stride())
        if memory not in by_memory:
            by_memory[memory] = tensor.detach().to("cpu", copy=True)
        copies[name] = by_memory[memory]
    return copies


class EarlyStopping:
    """
    Watches one loss per evaluation. An evaluation improves when its loss is below the best so far by more than
    `threshold`; the metrics and weights of the best evaluation are kept, and `should_stop` turns true after
    `patience` evaluations in a row without improvement.
    """

    def __init__(self, patience: int, threshold: float = 0.0):
        self.patience = patience
        self.threshold = threshold
        self.best_loss = math.inf
        self.best_step = self.best_metrics = self.best_state = None
        self.evaluations_without_improvement = 0

    def update(self, loss: float, step: int, metrics: dict, get_state_dict: Callable[[], dict]):
        """Record one evaluation. Call it on every process: `get_state_dict` may gather shards (FSDP)."""
        if loss < self.best_loss - self.threshold:
            self.best_loss, self.best_step, self.best_metrics = loss, step, metrics
            self.best_state = copy_to_cpu(get_state_dict())
            self.evaluations_without_improvement = 0
        else:
            self.evaluations_without_improvement += 1

    @property
    def should_stop(self) -> bool:
        return self.evaluations_without_improvement >= self.patience
