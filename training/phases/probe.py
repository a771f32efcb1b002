"""
Phase `probe` (the paper's phases 2 and 3): the pretrained model frozen, its towers run over the data once (or at
every step, see feature_cache/probe_cache.py), and `--probe_replicas` MLP probes per tower trained by AdamW on their features.
"""

import math
import re
import shutil
from pathlib import Path

import torch
from accelerate.utils import DistributedType
from torch import nn

from modeling_twotower import TwoTowerConfig

from ..loading import MODEL_CLASSES, load_two_tower_config
from ..data.objectives import objective_of
from ..optim.optimization import adamw_description
from ..feature_cache.probe_cache import CACHE_DIR, cache_both_splits, process_counts
from ..data.tokenizer import check_tokenizer_fits
from ..utils.errors import TwoTowerUserError
from .validation import evaluate_cached
from .base import TrainingPhase, trained_state_dict
from .replica_sampling import batch_positions, replica_orders, step_positions, stream_lengths


class ProbesOnPositions(nn.Module):
    """
    The model's probes behind a forward that scores given positions (`TwoTowerProbes.score_positions`): features
    [towers or probes, n, hidden] and targets [n] or [probes, n] -> gold log-probabilities [probes, n], or with
    `num_items` the loss alone (`TwoTowerProbes.summed_loss`, without logits). It is what the optimizer trains in
    the probe phase, so that DDP wraps the call whose gradients it syncs; its state dict keys are the model's
    (`probes.*`). `clip_per_probe`: `clip_gradients` clips each probe on its own.
    """

    def __init__(self, probes: nn.Module, chunk_size: int | None = None, clip_per_probe: bool = False):
        super().__init__()
        self.probes = probes
        self.chunk_size = chunk_size
        self.clip_per_probe = clip_per_probe

    def forward(self, features: torch.Tensor, targets: torch.LongTensor, num_items=None) -> torch.Tensor:
        if num_items is not None:
            return self.probes.summed_loss(features, targets, num_items)
        return self.probes.score_positions(features, targets, self.chunk_size)


class ProbePhase(TrainingPhase):
    """
    MLP probes of a frozen pretrained model, trained by AdamW on its towers' features; it holds the features of both
    splits (`caches`) and the positions a step reads.
    """

    name = "probe"

    def __init__(self, config):
        super().__init__(config)
        self.joint_metrics = None  # the frozen joint model's validation metrics, once evaluated
        self.caches = None  # {"train", "validation"}: the frozen towers' features (cached or not), from build_data
        self.positions_per_step = None  # positions per step and process
        self.steps_per_epoch = None
        self.eval_chunk = config.per_device_eval_batch_size * config.block_size  # positions a validation chunk

    def resolve_model_config(self) -> TwoTowerConfig:
        """The pretrained model's architecture."""
        model_config = load_two_tower_config(self.config.pretrained_model, "--pretrained_model", saved_by="pretrain")
        self.config.check_block_size(model_config)
        return model_config

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
        """
        Only the probes, behind a forward on cached positions (the frozen backbone stays outside `prepare`,
        unwrapped); the rest of the model frozen, in eval mode.
        """
        model.requires_grad_(False).eval().to(device)
        clip_per_probe = self.config.probe_grad_clipping == "per_probe"
        return ProbesOnPositions(model.probes.requires_grad_(True), self.config.probe_chunk_size, clip_per_probe)

    # The optimizer: the base's AdamW over the probes (the paper's), its clipping named
    @property
    def optimizer_description(self) -> str:
        return adamw_description(self.config, " per probe" if self.config.probe_grad_clipping == "per_probe" else "")

    def optimizer_step(self, run, window) -> tuple[float, float | None, int]:
        """One AdamW step: (loss, gradient norm, cached positions it trained on over all processes)."""
        return self.gradient_step(run, window)

    def build_data(self, accelerator, model, lm_datasets, collators, objective: str) -> tuple[int, int]:
        """
        The frozen towers' features of both splits, and steps of `positions_per_step` positions of this process's
        blocks, in each replica's order of the blocks; returns (optimizer steps, steps) per epoch.
        """
        self.caches = cache_both_splits(accelerator, model, lm_datasets, collators, objective, self.config)
        train = self.caches["train"]
        self.positions_per_step = batch_positions(accelerator, train, self.config)
        # every process takes the same number of steps; the last of an epoch takes what its shortest stream has left
        streams = stream_lengths(self.replica_orders(0, train.num_blocks), train.block_starts)
        self.steps_per_epoch = math.ceil(min(process_counts(accelerator, int(streams.min()))) / self.positions_per_step)
        return self.steps_per_epoch, self.steps_per_epoch

    def loss_function(self, trained: nn.Module):
        """
        A batch holds cached positions, {"features": [probes, n, hidden], "targets": [probes, n]}: the sum over
        probes of each probe's token-mean NLL, computed without the logits.
        """
        return lambda batch, num_items: trained(batch["features"], batch["targets"], num_items)

    def epoch_windows(self, run, epoch: int, units_to_skip: int):
        """One window a step: each replica's positions of the step, from a FeatureCache or recomputed blocks."""
        features = self.caches["train"]
        orders = self.replica_orders(epoch, features.num_blocks)
        for step in range(units_to_skip, self.steps_per_epoch):
            positions = step_positions(orders, step, self.steps_per_epoch, self.positions_per_step,
                                       features.block_starts)
            yield [features.replica_batch(positions)]

    def replica_orders(self, epoch: int, num_blocks: int) -> torch.LongTensor:
        """Each replica's order of this process's blocks in `epoch`: all of them, or its own slice (disjoint)."""
        disjoint = self.config.probe_replica_data == "disjoint"
        return replica_orders(self.config.seed, epoch, self.config.probe_replicas, num_blocks, disjoint)

    def evaluate(self, run) -> dict:
        """The probes' metrics, and the frozen joint model's, computed at the first evaluation and then reused."""
        metrics = evaluate_cached(run.accelerator, run.model, self.caches["validation"], self.eval_chunk,
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
        The kept step in config.json (scoring refuses probes without it), the optimizer and `probe_runs`, which
        probes trained together.
        """
        final_model.config.probe_training_steps = kept_step
        records = super().records(run, final_model, kept_step)
        return {**records, "probe_runs": self.probe_runs(run.model.config.num_towers)}

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
