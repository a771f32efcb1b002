"""What each phase trains: `pretrain` a new joint model, `probe` the probes of a frozen pretrained model."""

import torch
from accelerate.utils import DistributedType
from torch import nn
from torch.distributed.fsdp import FSDPModule

from modeling_twotower import TwoTowerConfig

from .arguments import TwoTowerTrainingConfig
from .errors import TwoTowerUserError
from .linear_probes import make_lbfgs
from .loading import MODEL_CLASSES, load_two_tower_config
from .objectives import objective_of
from .tokenizer import check_tokenizer_fits, padded_vocab_size


def resolve_model_config(config: TwoTowerTrainingConfig) -> TwoTowerConfig:
    """
    The architecture of the run, checked against the data before any long work: the pretrained model's (probe)
    or the preset with overrides (pretrain; its vocabulary follows the tokenizer, see `build_model`).
    """
    if config.phase == "probe":
        model_config = load_two_tower_config(config.pretrained_model, "--pretrained_model", saved_by="pretrain")
    else:
        model_config = TwoTowerConfig.from_preset(config.model_preset, **config.model_overrides())
    if config.block_size > model_config.max_position_embeddings:
        raise ValueError(
            f"--block_size {config.block_size} exceeds the model's max_position_embeddings "
            f"({model_config.max_position_embeddings}); lower --block_size"
            + (" or raise --max_position_embeddings." if config.phase == "pretrain" else ".")
        )
    return model_config


def resolve_objective(config: TwoTowerTrainingConfig, model_config: TwoTowerConfig) -> str:
    """`causal` or `masked`: as asked when pretraining (causal by default); the pretrained model's for probes."""
    if config.phase == "pretrain":
        return config.objective or "causal"
    objective = objective_of(model_config)
    if config.objective not in (None, objective):
        raise ValueError(
            f"--objective {config.objective} does not fit --pretrained_model {config.pretrained_model!r}, a "
            f"{objective} LM ({model_config.architectures[0]}); drop --objective, the probes take the model's."
        )
    return objective


def build_model(config: TwoTowerTrainingConfig, model_config: TwoTowerConfig, tokenizer, objective: str):
    """
    The pretrained model with new probes (probe), or a new model whose vocabulary is the tokenizer's padded to a
    multiple of 64 (pretrain).
    """
    if config.phase == "probe":
        check_tokenizer_fits(tokenizer, model_config.vocab_size)
        model = MODEL_CLASSES[objective].from_pretrained(config.pretrained_model)
        # New probes drawn from the run's seed: the saved ones hold the pretraining run's random init, so probe runs
        # with different seeds would otherwise all start from the same probes. The config follows (replicas, type).
        model.reset_probes(config.probe_replicas, config.probe_type)
        return model
    model_config = TwoTowerConfig.from_preset(
        config.model_preset,
        vocab_size=padded_vocab_size(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **config.model_overrides(),
    )
    model = MODEL_CLASSES[objective](model_config)
    if config.gradient_checkpointing:
        model.activation_checkpointing_enable()
    return model


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


def trained_module(config: TwoTowerTrainingConfig, model, device: torch.device) -> nn.Module:
    """The module the optimizer updates: the model without its probes, or only the probes of a frozen model."""
    if config.phase == "pretrain":
        # The probes take no part in the joint loss; frozen, DDP does not wait for their gradients.
        model.probes.requires_grad_(False)
        return model
    model.requires_grad_(False).eval().to(device)
    clip_per_probe = config.probe_grad_clipping == "per_probe"
    return ProbesOnPositions(model.probes.requires_grad_(True), config.probe_chunk_size, clip_per_probe)


def weight_decay_groups(module: nn.Module, weight_decay: float, exclude: str = "norms_and_biases") -> list[dict]:
    """
    AdamW groups [decayed, not decayed]. `exclude` names the parameters not decayed: norms_and_biases (every norm
    and bias), tower_norms_and_biases (the reference BERT's, ttlm/model.py prepare_optimizer_parameters: every bias
    and the norms inside the towers' layers; the embedding, fusion and probe norms decay) or none (the reference
    GPT's and ELMo's, which give DeepSpeed every parameter with one weight decay).
    """
    decay, no_decay, seen = [], [], set()
    for module_name, submodule in module.named_modules():
        is_norm = "norm" in module_name.rsplit(".", 1)[-1].lower()
        in_tower_layer = ".layers." in f".{module_name}."  # model.layers.<depth>...: the towers' transformer layers
        for name, param in submodule.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:  # tied weights appear under two modules
                continue
            seen.add(id(param))
            is_bias = name.startswith("bias")  # LSTM: bias_ih_l0
            excluded = {
                "norms_and_biases": is_norm or is_bias,
                "tower_norms_and_biases": (is_norm and in_tower_layer) or is_bias,
                "none": False,
            }[exclude]
            (no_decay if excluded else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(config: TwoTowerTrainingConfig, trained: nn.Module) -> torch.optim.Optimizer:
    """AdamW with the config's hyper-parameters and weight-decay groups; full-batch L-BFGS for linear probes."""
    if config.phase == "probe" and config.probe_type == "linear":
        return make_lbfgs(trained, config.probe_tolerance)
    return torch.optim.AdamW(
        weight_decay_groups(trained, config.weight_decay, config.weight_decay_exclude),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
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
    if not (isinstance(probes, ProbesOnPositions) and probes.clip_per_probe):
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


def probe_runs(config: TwoTowerTrainingConfig, num_towers: int) -> dict:
    """
    Which probes were trained together, recorded with the model (`probe_runs` in its training_config.yaml): run r
    is replica r of every tower, probe `t * probe_replicas + r`. Scoring treats a run's probes as one paired
    measurement.
    """
    replicas = config.probe_replicas
    if config.probe_type == "linear":
        data_order = "full batch: every probe read every cached position at every L-BFGS iteration"
    else:
        data_order = (f"replica r read the predicted positions of this process's blocks, the blocks in an order "
                      f"drawn from (seed {config.seed}, epoch, r) every epoch, the same for the probes of every tower")
    return {
        "num_towers": num_towers,
        "probe_replicas": replicas,
        "probe_type": config.probe_type,
        "probe_index": "tower * probe_replicas + replica",
        "runs": [[tower * replicas + replica for tower in range(num_towers)] for replica in range(replicas)],
        "data_order": data_order,
        "initialization": f"every probe its own draw, from seed {config.seed}",
    }


def make_loss_function(config: TwoTowerTrainingConfig, trained: nn.Module):
    """
    `loss(batch, num_items_in_batch)`: the phase's summed token loss divided by the window's token count. In the
    probe phase a batch holds cached positions, {"features": [probes, n, hidden], "targets": [probes, n]}, and the
    loss is the sum over probes of each probe's token-mean NLL.
    """
    if config.phase == "pretrain":
        return lambda batch, num_items: trained(**batch, num_items_in_batch=num_items).loss
    return lambda batch, num_items: -trained(batch["features"], batch["targets"]).sum() / num_items


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


def final_model_and_state_dict(
    accelerator, config: TwoTowerTrainingConfig, model, trained, trained_state: dict | None = None
):
    """
    The model to save and its full state dict. `trained_state` (e.g. the best evaluation's, from early stopping)
    replaces the trained module's current weights.
    """
    if trained_state is None:
        trained_state = trained_state_dict(accelerator, trained)
    if config.phase == "pretrain":
        final_model = plain_model(accelerator.unwrap_model(trained, keep_torch_compile=False))
        return final_model, without_tied_copies(final_model, trained_state)
    return model, {**model.state_dict(), **trained_state}  # ProbesOnPositions' keys are the model's `probes.*`
