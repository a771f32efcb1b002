"""
What every training phase has and does, whatever it trains: `TrainingPhase`, the interface the run's preparation
(run/run_setup.py) and the loop (train.py) call, and the helpers that turn what trained into the model to save.

A phase builds and holds what only it uses: its dataloaders or feature caches (`build_data`), its optimizer
(`make_optimizer`, with the size of its state for the disk estimate and its description for the model card) and its
loss. The run (`TrainingRun`) holds only what every phase has.
"""

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from ..arguments import TwoTowerTrainingConfig
from ..optim.optimization import ADAM_MOMENTS, adamw_description, make_adamw, train_step


def trained_state_dict(accelerator, trained) -> dict:
    """The trained module's full state dict (gathered from every process under FSDP/DeepSpeed)."""
    # torch.compile's wrapper prefixes every key with `_orig_mod.`; the saved model must not carry it.
    return {name.removeprefix("_orig_mod."): value for name, value in accelerator.get_state_dict(trained).items()}


def plain_model(model: nn.Module) -> nn.Module:
    """
    `model` as an instance of its own class. FSDP2's `fully_shard` swaps a module's class for a subclass
    (`FSDPTwoTowerForCausalLM`, defined in torch's `_fsdp_*` files), which save_pretrained would name in
    config.json's auto_map and whose files it would copy as the remote code; the copy is built on the meta device and
    saved with the gathered state dict, so it costs no memory.
    """
    if not isinstance(model, FSDPModule):
        return model
    model_class = next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))
    with torch.device("meta"):
        return model_class(model.config)


def without_tied_copies(model, state_dict: dict) -> dict:
    """
    `state_dict` less the tied weights' copies. save_pretrained drops a tied weight only when it shares storage with
    its source; a state dict gathered under FSDP/DeepSpeed holds separate copies, which would be saved twice.
    """
    tied_copies = model.get_expanded_tied_weights_keys(all_submodels=True)  # {tied weight: its source}
    return {name: tensor for name, tensor in state_dict.items() if name not in tied_copies}


class TrainingPhase:
    """
    What the phases share: a checkpoint at every epoch's end, no stopping rule of their own, and the state each
    builds, and the paper's AdamW. A subclass says how it resolves and builds the model, what trains, its data, its
    loss, its step and its evaluation, and overrides the optimizer (`make_optimizer` with `optimizer_state_copies`
    and `optimizer_description`) where it trains with another.
    """

    name: str
    checkpoints_every_epoch = True  # besides every --checkpointing_steps
    lr_scheduler_type = None  # None: the config's --lr_scheduler_type

    def __init__(self, config: TwoTowerTrainingConfig):
        self.config = config
        self.optimizer = None  # built by make_optimizer, then prepared
        self.compute_loss = None  # `loss(batch, num_items_in_batch)` of the prepared module

    def check_accelerator(self, accelerator) -> None:
        """Refuse a launch the phase cannot train under."""

    # The optimizer: the paper's AdamW, unless a phase builds its own (linear probes: L-BFGS)
    def make_optimizer(self, trained: nn.Module) -> torch.optim.Optimizer:
        """Build the optimizer of `trained`, keep it (`self.optimizer`) and return it."""
        self.optimizer = make_adamw(self.config, trained)
        return self.optimizer

    @property
    def optimizer_state_copies(self) -> int:
        """How many copies of the trained parameters the optimizer's state holds (the checkpoints' disk estimate)."""
        return ADAM_MOMENTS

    @property
    def optimizer_description(self) -> str:
        """The optimizer in one line, as the model card prints it (saved in training_config.yaml as `optimizer`)."""
        return adamw_description(self.config)

    def gradient_step(self, run, window) -> tuple[float, float | None, int]:
        """(loss, gradient norm, target tokens over all processes) of one step of this phase's optimizer on `window`."""
        return train_step(run.accelerator, run.trained, window, self.compute_loss, self.optimizer, run.lr_scheduler,
                          self.config.max_grad_norm, run.objective)

    def prepare(self, accelerator, trained, lr_scheduler) -> tuple:
        """One `accelerator.prepare` of what trains, the optimizer and the schedule; returns (trained, scheduler)."""
        trained, self.optimizer, lr_scheduler = accelerator.prepare(trained, self.optimizer, lr_scheduler)
        self.compute_loss = self.loss_function(trained)
        return trained, lr_scheduler

    def converged(self, loss: float, grad_norm, train_losses: list) -> bool:
        """Whether the step just taken ends training before --max_train_steps: only L-BFGS stops on its own."""
        return False

    def report_end(self, run, outcome) -> None:
        """Say how the loop ended, where the phase has more to say than its last log line."""

    def records(self, run, final_model, kept_step: int) -> dict:
        """What the saved training_config.yaml records beside the options: the optimizer, the precision it trained
        in (Accelerate's, whichever of the option, `accelerate launch` or its config set it: "no", "bf16", "fp16"),
        and the phase's own."""
        return {"optimizer": self.optimizer_description, "precision": run.accelerator.mixed_precision}

    def clean_up(self, run) -> None:
        """Remove what the run kept only while it trained, once the model is saved."""
