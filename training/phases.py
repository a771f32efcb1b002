"""
What each training phase does, chosen once per run (`make_phase`): `PretrainPhase` trains a new joint model,
`ProbePhase` the MLP probes of a frozen pretrained model on its towers' features, `LinearProbePhase` linear probes by
full-batch L-BFGS. The run's preparation (run_setup.py) and the loop (train.py) call the same methods whatever the
phase; this module is the one place that tells the phases apart.
"""

import math
import re
import shutil
from pathlib import Path

import torch
from accelerate.utils import DistributedType
from torch import nn
from torch.distributed.fsdp import FSDPModule

from modeling_twotower import TwoTowerConfig

from .arguments import TwoTowerTrainingConfig
from .data import make_dataloaders
from .utils.errors import TwoTowerUserError
from .linear_probes import check_linear_probes_fit, lbfgs_step, make_lbfgs
from .loading import MODEL_CLASSES, load_two_tower_config
from .objectives import SeededMaskingCollator, objective_of
from .optimization import accumulation_windows, make_adamw, train_step
from .probe_cache import (
    CACHE_DIR,
    batch_positions,
    cache_both_splits,
    process_counts,
    replica_orders,
    step_positions,
    stream_lengths,
)
from .tokenizer import check_tokenizer_fits, padded_vocab_size
from .validation import evaluate_blocks, evaluate_cached


class ProbesOnPositions(nn.Module):
    """
    The model's probes behind a forward that scores given positions (`TwoTowerProbes.score_positions`): features
    [towers or probes, n, hidden] and targets [n] or [probes, n] -> gold log-probabilities [probes, n]. It is what
    the optimizer trains in the probe phase, so that DDP wraps the call whose gradients it syncs; its state dict
    keys are the model's (`probes.*`). `clip_per_probe`: `clip_gradients` clips each probe on its own.
    """

    def __init__(self, probes: nn.Module, chunk_size: int | None = None, clip_per_probe: bool = False):
        super().__init__()
        self.probes = probes
        self.chunk_size = chunk_size
        self.clip_per_probe = clip_per_probe

    def forward(self, features: torch.Tensor, targets: torch.LongTensor) -> torch.Tensor:
        return self.probes.score_positions(features, targets, self.chunk_size)


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
    """What the phases share: AdamW, a checkpoint at every epoch's end, no stopping rule of their own."""

    name: str
    checkpoints_every_epoch = True  # besides every --checkpointing_steps
    lr_scheduler_type = None  # None: the config's --lr_scheduler_type

    def __init__(self, config: TwoTowerTrainingConfig):
        self.config = config

    def check_accelerator(self, accelerator) -> None:
        """Refuse a launch the phase cannot train under; every launch can run AdamW."""

    def make_optimizer(self, trained: nn.Module) -> torch.optim.Optimizer:
        return make_adamw(self.config, trained)

    def adamw_step(self, run, window) -> tuple[float, float | None, int]:
        """(loss, gradient norm, target tokens over all processes) of one AdamW step on `window`."""
        return train_step(run.accelerator, run.trained, window, run.loss_function, run.optimizer, run.lr_scheduler,
                          self.config.max_grad_norm, run.objective)

    def converged(self, loss: float, grad_norm, train_losses: list) -> bool:
        """Whether the step just taken ends training before --max_train_steps: only L-BFGS stops on its own."""
        return False

    def report_end(self, run, outcome) -> None:
        """Say how the loop ended, where the phase has more to say than its last log line."""

    def records(self, run, final_model, kept_step: int) -> dict | None:
        """What the saved training_config.yaml records beside the options (None: nothing more)."""
        return None

    def clean_up(self, run) -> None:
        """Remove what the run kept only while it trained, once the model is saved."""


class PretrainPhase(TrainingPhase):
    """Phase `pretrain` (the paper's phase 1): a new joint model trained on blocks of text, its probes left out."""

    name = "pretrain"

    # Before any long work
    def resolve_model_config(self) -> TwoTowerConfig:
        """The preset with the config's overrides; its vocabulary follows the tokenizer (see `build_model`)."""
        model_config = TwoTowerConfig.from_preset(self.config.model_preset, **self.config.model_overrides())
        return check_block_size(self.config, model_config, " or raise --max_position_embeddings")

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

    def plan_epochs(self, accelerator, model, lm_datasets, collators, objective: str) -> dict:
        """
        Windows of blocks: accelerate shards the batches and steps the scheduler once per process, hence the
        factors; an accelerate config may set the accumulation steps: the accelerator's value is the one in force.
        """
        config = self.config
        train_dataloader, eval_dataloader = make_dataloaders(
            lm_datasets, config.per_device_train_batch_size, config.per_device_eval_batch_size, *collators
        )
        units_per_epoch = math.ceil(len(train_dataloader) / accelerator.num_processes)  # batches of this process
        return {"train_dataloader": train_dataloader, "eval_dataloader": eval_dataloader,
                "units_per_epoch": units_per_epoch,
                "steps_per_epoch": math.ceil(units_per_epoch / accelerator.gradient_accumulation_steps)}

    def prepare(self, accelerator, trained, optimizer, lr_scheduler, plan: dict) -> tuple:
        """One `accelerator.prepare` of what trains and of the dataloaders; returns (trained, optimizer, scheduler)."""
        trained, optimizer, plan["train_dataloader"], plan["eval_dataloader"], lr_scheduler = accelerator.prepare(
            trained, optimizer, plan["train_dataloader"], plan["eval_dataloader"], lr_scheduler
        )
        return trained, optimizer, lr_scheduler

    def loss_function(self, trained: nn.Module):
        """`loss(batch, num_items_in_batch)`: the summed token loss divided by the window's token count."""
        return lambda batch, num_items: trained(**batch, num_items_in_batch=num_items).loss

    # The loop
    def epoch_windows(self, run, epoch: int, units_to_skip: int):
        """The accumulation windows of `epoch`, less the first `units_to_skip` batches (a resumed epoch)."""
        train_dataloader = run.train_dataloader
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
        loss, grad_norm, _ = self.adamw_step(run, window)
        return loss, grad_norm, len(window) * run.tokens_per_batch

    def evaluate(self, run) -> dict:
        return evaluate_blocks(run.accelerator, run.trained, run.eval_dataloader)

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


class ProbePhase(TrainingPhase):
    """
    Phase `probe` (the paper's phases 2 and 3): the pretrained model frozen, its towers run over the data once
    (or at every step, see probe_cache.py), and `--probe_replicas` MLP probes per tower trained on their features.
    """

    name = "probe"

    def __init__(self, config: TwoTowerTrainingConfig):
        super().__init__(config)
        self.joint_metrics = None  # the frozen joint model's validation metrics, once evaluated

    def resolve_model_config(self) -> TwoTowerConfig:
        """The pretrained model's architecture."""
        model_config = load_two_tower_config(self.config.pretrained_model, "--pretrained_model", saved_by="pretrain")
        return check_block_size(self.config, model_config, "")

    def resolve_objective(self, model_config: TwoTowerConfig) -> str:
        """The pretrained model's objective; another one asked for is refused."""
        objective = objective_of(model_config)
        if self.config.objective not in (None, objective):
            raise ValueError(
                f"--objective {self.config.objective} does not fit --pretrained_model "
                f"{self.config.pretrained_model!r}, a {objective} LM ({model_config.architectures[0]}); drop "
                f"--objective, the probes take the model's."
            )
        return objective

    def build_model(self, model_config: TwoTowerConfig, tokenizer, objective: str):
        """The pretrained model, with new probes."""
        check_tokenizer_fits(tokenizer, model_config.vocab_size)
        model = MODEL_CLASSES[objective].from_pretrained(self.config.pretrained_model)
        # New probes drawn from the run's seed: the saved ones hold the pretraining run's random init, so probe runs
        # with different seeds would otherwise all start from the same probes. The config follows (replicas, type).
        model.reset_probes(self.config.probe_replicas, self.config.probe_type)
        return model

    def check_accelerator(self, accelerator) -> None:
        """FSDP is refused: it would gather the small probes at every step."""
        if accelerator.distributed_type == DistributedType.FSDP:
            raise TwoTowerUserError(
                "The probe phase trains only the probes of a frozen model, which FSDP would gather at every step; "
                "launch it with training/accelerate_configs/ddp.yaml (or one process): the probes are small."
            )

    def trained_module(self, model, device: torch.device) -> nn.Module:
        """Only the probes, behind a forward on cached positions; the rest of the model frozen, in eval mode."""
        model.requires_grad_(False).eval().to(device)
        clip_per_probe = self.config.probe_grad_clipping == "per_probe"
        return ProbesOnPositions(model.probes.requires_grad_(True), self.config.probe_chunk_size, clip_per_probe)

    def plan_epochs(self, accelerator, model, lm_datasets, collators, objective: str) -> dict:
        """
        The frozen towers' features of both splits, and steps of `positions_per_step` positions of this process's
        blocks, in each replica's order of the blocks.
        """
        caches = cache_both_splits(accelerator, model, lm_datasets, collators, objective, self.config)
        positions_per_step = batch_positions(accelerator, caches["train"], self.config)
        # every process takes the same number of steps; the last of an epoch takes what its shortest stream has left
        streams = stream_lengths(self.replica_orders(0, caches["train"].num_blocks), caches["train"].block_starts)
        steps_per_epoch = math.ceil(min(process_counts(accelerator, int(streams.min()))) / positions_per_step)
        return {"caches": caches, "positions_per_step": positions_per_step, "steps_per_epoch": steps_per_epoch,
                "units_per_epoch": steps_per_epoch}

    def prepare(self, accelerator, trained, optimizer, lr_scheduler, plan: dict) -> tuple:
        """The probes, optimizer and schedule; the frozen backbone stays outside, unwrapped."""
        return accelerator.prepare(trained, optimizer, lr_scheduler)

    def loss_function(self, trained: nn.Module):
        """
        A batch holds cached positions, {"features": [probes, n, hidden], "targets": [probes, n]}: the sum over
        probes of each probe's token-mean NLL.
        """
        return lambda batch, num_items: -trained(batch["features"], batch["targets"]).sum() / num_items

    def epoch_windows(self, run, epoch: int, units_to_skip: int):
        """One window a step: each replica's positions of the step, from a FeatureCache or recomputed blocks."""
        features = run.caches["train"]
        orders = self.replica_orders(epoch, features.num_blocks)
        for step in range(units_to_skip, run.steps_per_epoch):
            positions = step_positions(orders, step, run.steps_per_epoch, run.positions_per_step, features.block_starts)
            yield [features.replica_batch(positions)]

    def replica_orders(self, epoch: int, num_blocks: int) -> torch.LongTensor:
        """Each replica's order of this process's blocks in `epoch`: all of them, or its own slice (disjoint)."""
        disjoint = self.config.probe_replica_data == "disjoint"
        return replica_orders(self.config.seed, epoch, self.config.probe_replicas, num_blocks, disjoint)

    def optimizer_step(self, run, window) -> tuple[float, float | None, int]:
        """One AdamW step: (loss, gradient norm, cached positions it trained on over all processes)."""
        return self.adamw_step(run, window)

    def evaluate(self, run) -> dict:
        """The probes' metrics, and the frozen joint model's, computed at the first evaluation and then reused."""
        metrics = evaluate_cached(run.accelerator, run.model, run.caches["validation"], run.eval_chunk,
                                  self.config.probe_chunk_size, self.joint_metrics)
        self.joint_metrics = {name: metrics[name] for name in ("loss", "perplexity")}
        return metrics

    def monitored_loss(self, metrics: dict) -> float:
        """
        The mean over all probes (they train as one), which is the mean of the towers' `probe_{t}_loss` (each the
        mean over the tower's replicas).
        """
        tower_losses = [value for name, value in metrics.items() if re.fullmatch(r"probe_\d+_loss", name)]
        return sum(tower_losses) / len(tower_losses)

    def final_model_and_state_dict(self, accelerator, model, trained, trained_state: dict | None = None):
        """The whole model with the trained (or the best evaluation's) probes."""
        if trained_state is None:
            trained_state = trained_state_dict(accelerator, trained)
        return model, {**model.state_dict(), **trained_state}  # ProbesOnPositions' keys are the model's `probes.*`

    def records(self, run, final_model, kept_step: int) -> dict:
        """
        The kept step in config.json (scoring refuses probes without it) and `probe_runs`, which probes trained
        together.
        """
        final_model.config.probe_training_steps = kept_step
        return {"probe_runs": self.probe_runs(run.model.config.num_towers)}

    def probe_runs(self, num_towers: int) -> dict:
        """
        Which probes were trained together: run r is replica r of every tower, probe `t * probe_replicas + r`.
        Scoring treats a run's probes as one paired measurement.
        """
        replicas, seed = self.config.probe_replicas, self.config.seed
        return {
            "num_towers": num_towers,
            "probe_replicas": replicas,
            "probe_type": self.config.probe_type,
            "probe_index": "tower * probe_replicas + replica",
            "runs": [[tower * replicas + replica for tower in range(num_towers)] for replica in range(replicas)],
            "data_order": self.data_order,
            "initialization": f"every probe its own draw, from seed {seed}",
        }

    @property
    def data_order(self) -> str:
        blocks = ("the r-th of probe_replicas equal contiguous slices of this process's blocks (disjoint)"
                  if self.config.probe_replica_data == "disjoint" else "this process's blocks")
        return (f"replica r read the predicted positions of {blocks}, the blocks in an order drawn "
                f"from (seed {self.config.seed}, epoch, r) every epoch, the same for the probes of every tower")

    def clean_up(self, run) -> None:
        """A disk cache is this run's working copy (a resumed run rebuilds it)."""
        if run.accelerator.is_main_process:
            shutil.rmtree(Path(self.config.output_dir) / CACHE_DIR, ignore_errors=True)


class LinearProbePhase(ProbePhase):
    """The probe phase with `--probe_type linear`: each probe solved by full-batch L-BFGS, an iteration a step."""

    checkpoints_every_epoch = False  # an epoch is one iteration: checkpoint every --checkpointing_steps only
    lr_scheduler_type = "constant"  # L-BFGS sizes its steps by line search, at lr 1

    data_order = "full batch: every probe read every cached position at every L-BFGS iteration"

    def check_accelerator(self, accelerator) -> None:
        """As the MLP probes', and L-BFGS needs whole gradients and no fp16 loss scaling."""
        super().check_accelerator(accelerator)
        check_linear_probes_fit(accelerator)

    def make_optimizer(self, trained: nn.Module) -> torch.optim.Optimizer:
        return make_lbfgs(trained, self.config.probe_tolerance)

    def plan_epochs(self, accelerator, model, lm_datasets, collators, objective: str) -> dict:
        """The frozen towers' features of both splits; an epoch is one step on the full batch."""
        caches = cache_both_splits(accelerator, model, lm_datasets, collators, objective, self.config)
        return {"caches": caches, "positions_per_step": None, "steps_per_epoch": 1, "units_per_epoch": 1}

    def epoch_windows(self, run, epoch: int, units_to_skip: int):
        if not units_to_skip:
            yield [run.caches["train"]]

    def optimizer_step(self, run, window) -> tuple[float, float | None, int]:
        """One L-BFGS iteration: (objective, largest gradient entry, positions scored)."""
        return lbfgs_step(run.accelerator, run.trained, window[0], run.optimizer, run.lr_scheduler,
                          self.config.probe_l2, run.eval_chunk)

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


def make_phase(config: TwoTowerTrainingConfig) -> TrainingPhase:
    """The phase `config` asks for: the one choice every other step of the run follows."""
    if config.phase == "pretrain":
        return PretrainPhase(config)
    return LinearProbePhase(config) if config.probe_type == "linear" else ProbePhase(config)


def check_block_size(config: TwoTowerTrainingConfig, model_config: TwoTowerConfig, other_fix: str) -> TwoTowerConfig:
    """`model_config`, once --block_size is known to fit its positions."""
    if config.block_size > model_config.max_position_embeddings:
        raise ValueError(
            f"--block_size {config.block_size} exceeds the model's max_position_embeddings "
            f"({model_config.max_position_embeddings}); lower --block_size{other_fix}."
        )
    return model_config
