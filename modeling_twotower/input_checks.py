"""Checks of what a user passes to the two-tower models: each wrong input raises one error that names the value and
the fix, before any work (instead of an IndexError or a silent broadcast deep inside the towers)."""

import torch
from transformers.masking_utils import find_packed_sequence_indices
from transformers.utils import logging

from .configuration_twotower import TwoTowerConfig

logger = logging.get_logger(__name__)

TOKEN_ID_DTYPES = (torch.int64, torch.int32)  # what the embedding looks token ids up with


def check_inputs(
    config: TwoTowerConfig,
    towers,
    bidirectional: bool,
    input_ids,
    inputs_embeds,
    attention_mask,
    position_ids,
    past_seen_tokens: int,
    use_cache: bool,
    output_attentions: bool,
):
    """The inputs of TwoTowerModel.forward against the config and the facts of its stack `towers` (a TowerStack)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`.")
    check_input_shape(input_ids, inputs_embeds)
    if input_ids is not None:
        check_input_ids_dtype(input_ids)
    if (use_cache and not towers.has_cache) or (output_attentions and not towers.has_attention):
        option = "use_cache" if use_cache and not towers.has_cache else "output_attentions"
        raise ValueError(
            f"`{option}=True` does not apply to {towers.kind_name} towers (no attention, no key/value cache); "
            "drop it."
        )
    if bidirectional and use_cache:
        raise ValueError("`use_cache=True` needs causal towers; a bidirectional (masked) model has no cache.")
    seq_len = (input_ids if input_ids is not None else inputs_embeds).shape[1]
    if position_ids is None and past_seen_tokens + seq_len > config.max_position_embeddings:
        raise ValueError(
            f"Sequence length {past_seen_tokens + seq_len} (cached {past_seen_tokens} + new {seq_len}) exceeds "
            f"max_position_embeddings={config.max_position_embeddings}; truncate the input "
            f"(e.g. tokenizer(..., truncation=True, max_length={config.max_position_embeddings}))."
        )
    # A data-dependent check cannot be traced; compiled graphs rely on the eager runs having checked.
    if position_ids is not None and not torch.compiler.is_compiling():
        check_position_ids(position_ids, attention_mask, config, towers)
    # A data-dependent check cannot be traced; compiled graphs rely on the eager runs having checked.
    if input_ids is not None and not torch.compiler.is_compiling():
        vocab_size = config.vocab_size
        if bool(((input_ids < 0) | (input_ids >= vocab_size)).any()):
            bad = input_ids[(input_ids < 0) | (input_ids >= vocab_size)][0].item()
            raise ValueError(
                f"Token id {bad} is outside [0, {vocab_size}); the tokenizer does not match this model "
                f"(resize it with `model.resize_token_embeddings(len(tokenizer))`)."
            )


def check_input_shape(input_ids, inputs_embeds):
    # one clear error before any work, instead of an IndexError or an empty reduction deep inside the towers
    if input_ids is not None and input_ids.dim() != 2:
        raise ValueError(
            f"`input_ids` has shape {tuple(input_ids.shape)}; pass token ids of shape [batch, seq] (one sequence: "
            f"`input_ids[None]`; more dimensions: `input_ids.view(-1, input_ids.shape[-1])`)."
        )
    if inputs_embeds is not None and inputs_embeds.dim() != 3:
        raise ValueError(
            f"`inputs_embeds` has shape {tuple(inputs_embeds.shape)}; pass embeddings of shape "
            f"[batch, seq, embedding_size]."
        )
    inputs = input_ids if input_ids is not None else inputs_embeds
    if inputs is not None and inputs.shape[0] * inputs.shape[1] == 0:
        name = "input_ids" if input_ids is not None else "inputs_embeds"
        raise ValueError(
            f"`{name}` has shape {tuple(inputs.shape)}, no tokens; pass at least one sequence of at least one token."
        )


def check_input_ids_dtype(input_ids: torch.Tensor):
    # before the embedding, whose error names neither the argument nor the fix
    if input_ids.dtype in TOKEN_ID_DTYPES:
        return
    if input_ids.dtype == torch.bool:
        fix = "a boolean tensor is a mask: pass it as `attention_mask`, and the token ids as input_ids"
    elif input_ids.is_floating_point():
        fix = "convert token ids with `input_ids.long()`, or pass embeddings as `inputs_embeds`"
    else:
        fix = "convert them with `input_ids.long()`"
    raise ValueError(
        f"`input_ids` has dtype {input_ids.dtype}, but input_ids must be integer token ids (torch.long or "
        f"torch.int32, as a tokenizer returns them with return_tensors='pt'); {fix}."
    )


def check_position_ids(position_ids: torch.LongTensor, attention_mask, config: TwoTowerConfig, towers):
    # Packed rows restart their positions, so the largest position, not the row length, must fit the table.
    largest = int(position_ids.max())
    if largest >= config.max_position_embeddings:
        raise ValueError(
            f"`position_ids` reach {largest}, beyond max_position_embeddings={config.max_position_embeddings} "
            f"(positions 0 to {config.max_position_embeddings - 1}); truncate each sequence to "
            f"{config.max_position_embeddings} tokens."
        )
    packed = attention_mask is None and find_packed_sequence_indices(position_ids) is not None
    if packed and not towers.accepts_packed_rows:
        raise ValueError(
            f"`position_ids` restart inside a row (packed sequences), which {towers.kind_name} towers would read as "
            "one sequence; pass one sequence per row, padded, with an `attention_mask`."
        )


def check_label_values(labels: torch.LongTensor, vocab_size: int):
    # A data-dependent check cannot be traced; compiled graphs rely on the eager runs having checked.
    if torch.compiler.is_compiling():
        return
    bad = (labels != -100) & ((labels < 0) | (labels >= vocab_size))
    if bool(bad.any()):
        raise ValueError(
            f"`labels` holds {labels[bad][0].item()}, neither a token id in [0, {vocab_size}) nor -100 (ignored); "
            f"pass this model's token ids, with -100 where nothing is predicted (a tokenizer larger than the model: "
            f"`model.resize_token_embeddings(len(tokenizer))`)."
        )


def check_skip_logits(skip_logits: bool, labels: torch.LongTensor | None) -> None:
    """`skip_logits` asks for the loss alone, which needs labels."""
    if skip_logits and labels is None:
        raise ValueError("`skip_logits=True` returns the loss alone, computed from `labels`: pass `labels` too.")


def warn_if_no_target(target_ids: torch.LongTensor, num_items_in_batch=None):
    """
    The loss is a mean over the targets (`target_ids` not -100), or their sum divided by `num_items_in_batch`: with
    none it is 0 / 0, NaN, as in transformers' own LMs, and so are its gradients. Say so rather than return it
    silently. A batch without targets inside an accumulated one (`num_items_in_batch` > 0) is fine: its loss is 0.
    """
    if torch.compiler.is_compiling():  # data-dependent: compiled graphs rely on the eager runs having warned
        return
    if num_items_in_batch is not None:
        if bool(num_items_in_batch == 0):
            logger.warning(
                "`num_items_in_batch` is 0: no position of the accumulated batch has a target (every label is -100), "
                "so the loss (0 / 0) and its gradients are NaN; an optimizer step on them would make every weight NaN."
            )
    elif not bool((target_ids != -100).any()):
        logger.warning(
            "No position of the batch has a target (every label is -100, after the shift to next-token targets in a "
            "causal LM), so the loss, a mean over no tokens, is NaN. Pass labels with at least one token id (a causal "
            "LM predicts labels[:, 1:]: sequences of 2 tokens or more)."
        )


def check_labels(config: TwoTowerConfig, input_ids, inputs_embeds, labels):
    check_input_shape(input_ids, inputs_embeds)
    if labels is None:
        return
    inputs = input_ids if input_ids is not None else inputs_embeds
    if inputs is not None and labels.shape != inputs.shape[:2]:
        raise ValueError(
            f"`labels` has shape {tuple(labels.shape)} but the inputs have shape {tuple(inputs.shape[:2])}; "
            f"pass labels aligned with input_ids."
        )
    check_label_values(labels, config.vocab_size)


def check_probe_features(config: TwoTowerConfig, features, input_ids):
    expected = (config.num_towers, *input_ids.shape, config.hidden_size)
    if tuple(features.shape) != expected:
        raise ValueError(
            f"`features` has shape {tuple(features.shape)}, expected {expected}: pass "
            f"`probe_features(input_ids)` of a model with this config, computed on these input_ids."
        )


__all__ = [
    "check_input_ids_dtype",
    "check_input_shape",
    "check_inputs",
    "check_label_values",
    "check_labels",
    "check_position_ids",
    "check_probe_features",
    "check_skip_logits",
    "warn_if_no_target",
]
