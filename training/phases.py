"""What each phase trains: `pretrain` a new joint model, `probe` the probes of a frozen pretrained model."""

import json
from pathlib import Path

import torch
from torch import nn

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM, TwoTowerForMaskedLM

from .arguments import TwoTowerTrainingConfig
from .objectives import objective_of, predicting_positions, prediction_targets
from .tokenizer import check_tokenizer_fits, padded_vocab_size

MODEL_CLASSES = {"causal": TwoTowerForCausalLM, "masked": TwoTowerForMaskedLM}


def load_pretrained_config(pretrained_model: str) -> TwoTowerConfig:
    """The config of a pretrained two-tower model folder; a clear error for anything else."""
    config_file = Path(pretrained_model) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(
            f"--pretrained_model {pretrained_model!r} has no config.json; pass the `model` folder that a pretrain "
            f"run saved (OUTPUT_DIR/model)."
        )
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type != TwoTowerConfig.model_type:
        raise ValueError(
            f"--pretrained_model {pretrained_model!r} holds a {model_type!r} model, not a two-tower model "
            f"(model_type {TwoTowerConfig.model_type!r}); the probe phase needs a model saved by the pretrain phase."
        )
    return TwoTowerConfig.from_pretrained(pretrained_model)


def resolve_model_config(config: TwoTowerTrainingConfig) -> TwoTowerConfig:
    """
    The architecture of the run, checked against the data before any long work: the pretrained model's (probe)
    or the preset with overrides (pretrain; its vocabulary follows the tokenizer, see `build_model`).
    """
    if config.phase == "probe":
        model_config = load_pretrained_config(config.pretrained_model)
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
    """The pretrained model (probe), or a new one whose vocabulary is the tokenizer's padded to a multiple of 64."""
    if config.phase == "probe":
        check_tokenizer_fits(tokenizer, model_config.vocab_size)
        model = MODEL_CLASSES[objective].from_pretrained(config.pretrained_model)
        reinitialize_probes(model)
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


def reinitialize_probes(model):
    """
    Draw new probe weights from the current seed. The saved probes hold the pretraining run's random init, so
    probe runs with different seeds would otherwise all start from the same probes.
    """
    # from_pretrained flags every loaded tensor `_is_hf_initialized`, and transformers' init functions leave
    # flagged tensors alone: without clearing the flags, `_init_weights` would change nothing. Only `probes`:
    # the independent-towers control's `tower_lm_heads` are the same module class but trained.
    for param in model.probes.parameters():
        vars(param).pop("_is_hf_initialized", None)
    model.probes.apply(model._init_weights)


def trained_module(config: TwoTowerTrainingConfig, model, device: torch.device) -> nn.Module:
    """The module the optimizer updates: the model without its probes, or only the probes of a frozen model."""
    if config.phase == "pretrain":
        # The probes take no part in the joint loss; frozen, DDP does not wait for their gradients.
        model.probes.requires_grad_(False)
        return model
    model.requires_grad_(False).eval().to(device)
    return model.probes.requires_grad_(True)


def weight_decay_groups(module: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay every weight except norms and biases (the paper's setting)."""
    decay, no_decay, seen = [], [], set()
    for module_name, submodule in module.named_modules():
        is_norm = "norm" in module_name.rsplit(".", 1)[-1].lower()
        for name, param in submodule.named_parameters(recurse=False):
            if not param.requires_grad or id(param) in seen:  # tied weights appear under two modules
                continue
            seen.add(id(param))
            (no_decay if is_norm or name.startswith("bias") else decay).append(param)  # LSTM: bias_ih_l0
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_loss_function(config: TwoTowerTrainingConfig, model, trained: nn.Module):
    """`loss(batch, num_items_in_batch)`: the phase's summed token loss divided by the window's token count."""
    if config.phase == "pretrain":
        return lambda batch, num_items: trained(**batch, num_items_in_batch=num_items).loss
    objective = objective_of(model.config)

    def probe_loss(batch, num_items):
        # probes learn the objective of the model: the next token (causal) or the masked tokens (masked)
        with torch.no_grad():  # the frozen backbone builds no graph
            features = predicting_positions(model.probe_features(batch["input_ids"]), objective, seq_dim=2)
        targets = prediction_targets(batch["labels"], objective)  # [batch, seq - shift]
        gold_logprobs = trained(features, targets, config.probe_chunk_size)  # [towers, batch, seq - shift]
        return -gold_logprobs.sum() / num_items  # the sum over probes of each probe's token-mean NLL

    return probe_loss


def trained_state_dict(accelerator, trained) -> dict:
    """The trained module's full state dict (gathered from every process under FSDP/DeepSpeed)."""
    # torch.compile's wrapper prefixes every key with `_orig_mod.`; the saved model must not carry it.
    return {name.removeprefix("_orig_mod."): value for name, value in accelerator.get_state_dict(trained).items()}


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
        return accelerator.unwrap_model(trained, keep_torch_compile=False), trained_state
    return model, {**model.state_dict(), **{f"probes.{name}": value for name, value in trained_state.items()}}
