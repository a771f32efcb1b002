"""Phase `pretrain` (the paper's phase 1): a new joint model trained by AdamW on blocks of text."""

import math

import torch
from torch import nn

from modeling_twotower import TwoTowerConfig

from ..data.blocks import make_dataloaders
from ..loading import MODEL_CLASSES
from ..data.objectives import SeededMaskingCollator
from ..optim.optimization import accumulation_windows
from ..data.tokenizer import padded_vocab_size
from .validation import evaluate_blocks
from .base import TrainingPhase, plain_model, trained_state_dict, without_tied_copies


class PretrainPhase(TrainingPhase):
    """A new joint model trained on blocks of text, its probes left out; it holds the dataloaders of the blocks."""

    name = "pretrain"

    def __init__(self, config):
        super().__init__(config)
        self.train_dataloader = self.eval_dataloader = None
        self.tokens_per_batch = 0  # tokens of one micro-batch over all processes

    # Before any long work
    def resolve_model_config(self) -> TwoTowerConfig:
        """
        The preset with the config's overrides (the config checked it fits --block_size); its vocabulary follows the
        tokenizer (see `build_model`).
        """
        return TwoTowerConfig.from_preset(self.config.model_preset, **self.config.model_overrides())

    def resolve_objective(self, model_config: TwoTowerConfig) -> str:
        """`causal` or `masked`, as asked (causal by default)."""
        return self.config.objective or "causal"

    # Building the run
    def build_model(self, model_config: TwoTowerConfig, tokenizer, objective: str):
        """A new model whose vocabulary is the tokenizer's, padded to a multiple of 64."""
        config, model_class = self.config, MODEL_CLASSES[objective]
        model_config = TwoTowerConfig.from_preset(
            config.model_preset,
            vocab_size=padded_vocab_size(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            bidirectional=model_class.towers_bidirectional,  # saved, so that the folder names its objective
            **config.model_overrides(),
        )
        model = model_class(model_config)
        if config.gradient_checkpointing:
            model.activation_checkpointing_enable()
        return model

    def trained_module(self, model, device: torch.device) -> nn.Module:
        """The model itself; the probes take no part in the joint loss, and frozen, DDP does not wait for them."""
        model.probes.requires_grad_(False)
        return model

    def build_data(self, accelerator, model, lm_datasets, collators, objective: str) -> tuple[int, int]:
        """
        The dataloaders of the blocks; returns (optimizer steps, batches of this process) per epoch. Accelerate
        shards the batches and steps the scheduler once per process, hence the factors; an accelerate config may set
        the accumulation steps: the accelerator's value is the one in force.
        """
        config = self.config
        self.train_dataloader, self.eval_dataloader = make_dataloaders(
            lm_datasets, config.per_device_train_batch_size, config.per_device_eval_batch_size, *collators
        )
        self.tokens_per_batch = config.per_device_train_batch_size * config.block_size * accelerator.num_processes
        units_per_epoch = math.ceil(len(self.train_dataloader) / accelerator.num_processes)  # batches of this process
        return math.ceil(units_per_epoch / accelerator.gradient_accumulation_steps), units_per_epoch

    def prepare(self, accelerator, trained, lr_scheduler) -> tuple:
        """One `accelerator.prepare` of what trains, the optimizer, the dataloaders and the schedule."""
        trained, self.optimizer, self.train_dataloader, self.eval_dataloader, lr_scheduler = accelerator.prepare(
            trained, self.optimizer, self.train_dataloader, self.eval_dataloader, lr_scheduler
        )
        self.compute_loss = self.loss_function(trained)
        return trained, lr_scheduler

    def loss_function(self, trained: nn.Module):
        """
        `loss(batch, num_items_in_batch)`: the summed token loss divided by the window's token count, computed
        without the logits (`skip_logits`), which a training step does not read.
        """
        return lambda batch, num_items: trained(**batch, num_items_in_batch=num_items, skip_logits=True).loss

    # The loop
    def epoch_windows(self, run, epoch: int, units_to_skip: int):
        """The accumulation windows of `epoch`, less the first `units_to_skip` batches (a resumed epoch)."""
        train_dataloader = self.train_dataloader
        train_dataloader.set_epoch(epoch)
        if isinstance(train_dataloader.collate_fn, SeededMaskingCollator):
            # new masks every epoch, a function of (seed, epoch, block)
            train_dataloader.collate_fn.set_epoch(epoch)
        batches = train_dataloader
        if units_to_skip:  # resuming mid-epoch: the same order (seed, epoch) minus the batches already seen
            batches = run.accelerator.skip_first_batches(train_dataloader, units_to_skip)
        yield from accumulation_windows(batches, run.accelerator.gradient_accumulation_steps)

    def optimizer_step(self, run, window) -> tuple[float, float | None, int]:
        """One AdamW step: (loss, gradient norm, tokens it trained on over all processes)."""
        loss, grad_norm, _ = self.gradient_step(run, window)
        return loss, grad_norm, len(window) * self.tokens_per_batch

    def evaluate(self, run) -> dict:
        return evaluate_blocks(run.accelerator, run.trained, self.eval_dataloader)

    def monitored_loss(self, metrics: dict) -> float:
        """The loss early stopping watches: the joint model's."""
        return metrics["loss"]

    # The end
    def final_model_and_state_dict(self, accelerator, model, trained, trained_state: dict | None = None):
        """
        The model to save and its full state dict. `trained_state` (e.g. the best evaluation's, from early
        stopping) replaces the trained module's current weights.
        """
        if trained_state is None:
            trained_state = trained_state_dict(accelerator, trained)
        final_model = plain_model(accelerator.unwrap_model(trained, keep_torch_compile=False))
        return final_model, without_tied_copies(final_model, trained_state)
