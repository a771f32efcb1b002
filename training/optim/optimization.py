"""One optimizer step of AdamW over an accumulation window, the same for the joint model and for MLP probes."""

import contextlib

import torch
from accelerate.utils import DistributedType
from torch import nn
from transformers.trainer_pt_utils import get_parameter_names

from ..arguments import TwoTowerTrainingConfig
from ..utils.errors import TwoTowerUserError
from ..data.objectives import prediction_targets


# the parameters AdamW does not decay, by --weight_decay_exclude, as patterns of their lowercased names (Trainer's
# get_decay_parameter_names does the same): a bias (LSTM: bias_ih_l0), a parameter of a module named *norm*, one of
# such a module inside the towers' layers (model.towers.layers.<depth>...)
BIAS = r"(?:^|\.)bias[^.]*$"
NORM = r"(?:^|\.)[^.]*norm[^.]*\.[^.]+$"
TOWER_LAYER_NORM = r"(?:^|\.)layers\.(?:.*\.)?[^.]*norm[^.]*\.[^.]+$"
NOT_DECAYED = {"norms_and_biases": [NORM, BIAS], "tower_norms_and_biases": [TOWER_LAYER_NORM, BIAS], "none": []}
ADAM_MOMENTS = 2  # AdamW keeps two tensors the size of the trained parameters
EXCLUSION_WORDS = {
    "norms_and_biases": "not on norms and biases",
    "tower_norms_and_biases": "not on biases and the towers' LayerNorms",
    "none": "on every parameter",
}


def weight_decay_groups(module: nn.Module, weight_decay: float, exclude: str = "norms_and_biases") -> list[dict]:
    """
    AdamW groups [decayed, not decayed] of the trainable parameters, in `named_parameters` order (a tied weight
    once). `exclude` names the parameters not decayed: norms_and_biases (every norm and bias),
    tower_norms_and_biases (the reference BERT's, ttlm/model.py prepare_optimizer_parameters: every bias and the
    norms inside the towers' layers; the embedding, fusion and probe norms decay) or none (the reference GPT's and
    ELMo's, which give DeepSpeed every parameter with one weight decay).
    """
    decayed = set(get_parameter_names(module, [], NOT_DECAYED[exclude]))
    trainable = [(name, param) for name, param in module.named_parameters() if param.requires_grad]
    return [
        {"params": [param for name, param in trainable if name in decayed], "weight_decay": weight_decay},
        {"params": [param for name, param in trainable if name not in decayed], "weight_decay": 0.0},
    ]


def make_adamw(config: TwoTowerTrainingConfig, trained: nn.Module) -> torch.optim.AdamW:
    """AdamW with the config's hyper-parameters and weight-decay groups."""
    return torch.optim.AdamW(
        weight_decay_groups(trained, config.weight_decay, config.weight_decay_exclude),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
    )


def adamw_description(config: TwoTowerTrainingConfig, clipping: str = "") -> str:
    """make_adamw's optimizer in words, with the gradient clipping (`clipping`: how it applies, e.g. " per probe")."""
    clip = f"gradient clipping {config.max_grad_norm:g}{clipping}" if config.max_grad_norm else "no gradient clipping"
    return (
        f"AdamW, learning rate {config.learning_rate:g}, betas ({config.adam_beta1:g}, {config.adam_beta2:g}), eps "
        f"{config.adam_epsilon:g}, weight decay {config.weight_decay:g} ({EXCLUSION_WORDS[config.weight_decay_exclude]}"
        f"), {clip}"
    )


def clip_gradients(accelerator, trained: nn.Module, max_grad_norm: float) -> torch.Tensor | None:
    """
    Clip gradients to the norm `max_grad_norm`: of all trained parameters together, or (probes with
    `clip_per_probe`) of each probe's own. Probe p owns slice [p] of every batched probe weight; clipped alone, its
    step is the one it would take in a run of its own (the reference trained one probe per run), so probes trained
    together equal probes trained apart. Returns the norm before clipping: of all parameters, or the root sum of
    squares of the probes' (the same number).
    """
    probes = accelerator.unwrap_model(trained, keep_torch_compile=False)
    if not getattr(probes, "clip_per_probe", False):
        return accelerator.clip_grad_norm_(trained.parameters(), max_grad_norm)
    if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
        raise TwoTowerUserError(
            f"Probes clip their gradients one by one, which needs each probe's whole gradient, and "
            f"{accelerator.distributed_type} shards them; launch the probe phase with "
            f"training/accelerate_configs/ddp.yaml or one process (probes are small), or pass --max_grad_norm 0."
        )
    accelerator.unscale_gradients()  # fp16: the norms of the true gradients
    gradients = [param.grad for param in probes.parameters() if param.grad is not None]  # each [probes, ...]
    probe_norms = torch.stack([gradient.flatten(1).float().norm(dim=1) for gradient in gradients]).norm(dim=0)
    scales = (max_grad_norm / (probe_norms + 1e-6)).clamp(max=1.0)  # [probes], torch's clip_grad_norm_ per probe
    for gradient in gradients:
        gradient.mul_(scales.view(-1, *[1] * (gradient.dim() - 1)).to(gradient.dtype))
    return probe_norms.norm()


def accumulation_windows(batches, size: int):
    """Group micro-batches into lists of `size` (the last may be shorter): one list per optimizer step."""
    window = []
    for batch in batches:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def count_targets(batch: dict, objective: str) -> torch.Tensor:
    """Target tokens of a batch: its labelled positions (blocks), or the positions each probe reads (cached)."""
    if "targets" in batch:  # [probes, n] cached positions, every one a target
        return torch.tensor(batch["targets"].shape[1], device=batch["targets"].device)
    return prediction_targets(batch["labels"], objective).ne(-100).sum()


def train_step(accelerator, trained, window, loss_function, optimizer, lr_scheduler, max_grad_norm, objective):
    """
    Forward/backward over one accumulation window, clip, step; returns (global token-mean loss, grad norm, global
    count of target tokens).
    """
    # Weigh every target token of the global batch equally: count them over the window and all processes.
    num_items = accelerator.gather(sum(count_targets(batch, objective) for batch in window)).sum()
    if num_items == 0:  # its loss and gradients would be 0 / 0: one step would make every trained weight NaN
        raise TwoTowerUserError(
            f"An optimizer step's {len(window)} batch(es) have no target token on any process (every label is "
            "-100), so its loss and gradients would be NaN; give longer blocks (--block_size) or, for a masked LM, a "
            "higher --mlm_probability."
        )
    step_loss = 0.0
    for index, batch in enumerate(window):
        is_last = index == len(window) - 1
        # The window's last micro-batch syncs: DDP and FSDP reduce gradients then, and DeepSpeed, which steps inside
        # `accelerator.backward`, steps only then (unset, it took an optimizer step every micro-batch).
        accelerator.sync_gradients = is_last
        with contextlib.nullcontext() if is_last else accelerator.no_sync(trained), accelerator.autocast():
            loss = loss_function(batch, num_items)
            # `loss` is already this micro-batch's share of the global token mean: undo accelerate's division
            # by the accumulation steps and DDP's mean over processes.
            accelerator.backward(loss * accelerator.gradient_accumulation_steps * accelerator.num_processes)
        step_loss += loss.detach().float()  # FSDP's bf16 parameters give a bf16 loss: log its float32 sum
    grad_norm = clip_gradients(accelerator, trained, max_grad_norm) if max_grad_norm > 0 else None
    optimizer.step()
    lr_scheduler.step()
    optimizer.zero_grad()
    return accelerator.reduce(step_loss, "sum").item(), grad_norm, num_items.item()
