"""
The decoder's cross-entropy without the [tokens, vocabulary] logits: the vocabulary projection and its loss in
pieces of rows, each piece's gradients computed as its loss is (the fused linear cross-entropy of Liger Kernel,
in plain PyTorch ops). A training step then never holds the logits, the largest activation of a small model, and
each piece's softmax runs while the piece is still in cache.
"""

import math
import re

import torch
from torch.utils.flop_counter import register_flop_formula


MIN_PIECE_ROWS = 512
MIN_PIECE_ROWS_CACHED = 256  # where the decoder's weight has at most CACHED_WEIGHT_ELEMENTS
CACHED_WEIGHT_ELEMENTS = 2**21  # 8 MiB of float32


def piece_rows(num_tokens: int, hidden_size: int, vocab_size: int) -> int:
    # Liger Kernel's rule, a piece of logits about as large as the hidden states so memory stays at their size, with
    # a floor: each piece reads the decoder's weight three times, and once the weight outgrows the cache those reads
    # outweigh the arithmetic. In a sweep on a CPU from width 64 and vocabulary 4096 to GPT-2's head (768, 50257),
    # 512 rows were among the fastest sizes wherever the weight is large (64 rows took 1.7x their time at GPT-2's
    # head), and 256 rows wherever it is small (up to 8192 x 128), at 0.98x-2.7x the logits' speed (docs/speed.md).
    liger_rows = 2 ** math.ceil(math.log2(max(1, num_tokens * hidden_size // vocab_size)))
    floor = MIN_PIECE_ROWS_CACHED if hidden_size * vocab_size <= CACHED_WEIGHT_ELEMENTS else MIN_PIECE_ROWS
    return min(num_tokens, max(floor, liger_rows))


def _compute_dtype(hidden_states: torch.Tensor) -> torch.dtype:
    # the matmuls run in autocast's dtype where autocast is on, as nn.Linear's would
    device_type = hidden_states.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return hidden_states.dtype


def _piece_loss_and_logit_grad(hidden, weight, bias, targets, scale, with_grad: bool, logits_buffer):
    """One piece's summed token loss and, `with_grad`, d(loss * scale)/d(logits) [rows, vocab], at least float32;
    the logits are written over `logits_buffer` ([at least rows, vocab])."""
    logits = torch.addmm(bias, hidden, weight.t(), out=logits_buffer[: hidden.shape[0]])
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision upcast, as the LM losses
    counted = targets.ne(-100)
    gold_ids = targets.masked_fill(~counted, 0).unsqueeze(-1)
    gold_logits = logits.gather(-1, gold_ids)
    if not with_grad:
        log_normalizer = torch.logsumexp(logits, dim=-1, keepdim=True)
        return ((log_normalizer - gold_logits).squeeze(-1) * counted).sum(), None
    # one exponential per logit for both the loss and its softmax gradient, in the logits' memory
    row_max = logits.amax(dim=-1, keepdim=True)
    exp_logits = logits.sub_(row_max).exp_()
    sum_exp = exp_logits.sum(dim=-1, keepdim=True)
    loss = ((row_max + sum_exp.log() - gold_logits).squeeze(-1) * counted).sum()
    row_scale = (counted * scale).unsqueeze(-1)
    logit_grad = exp_logits.mul_(row_scale / sum_exp)
    return loss, logit_grad.scatter_add_(-1, gold_ids, -row_scale)


def _loss_and_grads(hidden_states, weight, bias, target_ids, num_items, rows, dtype, needs_grad):
    """
    The loss piece by piece, the matmuls in `dtype`, and the gradient of each of (hidden_states, weight, bias) that
    `needs_grad` flags, in its input's dtype (None for the others).
    """
    with torch.autocast(hidden_states.device.type, enabled=False):
        hidden, weight_c, bias_c = hidden_states.to(dtype), weight.to(dtype), bias.to(dtype)
        accumulated = torch.promote_types(dtype, torch.float32)
        scale = 1.0 / torch.as_tensor(num_items, dtype=accumulated, device=hidden.device)
        hidden_grad_pieces = []
        weight_grad = torch.zeros_like(weight, dtype=accumulated) if needs_grad[1] else None
        bias_grad = torch.zeros_like(bias, dtype=accumulated) if needs_grad[2] else None
        loss = hidden_states.new_zeros((), dtype=accumulated)
        # one piece's logits, reused by every piece: on the CPU a fresh one costs its page faults, more than its softmax
        logits_buffer = hidden.new_empty((min(rows, hidden.shape[0]), weight.shape[0]))
        for start in range(0, hidden.shape[0], rows):
            piece = slice(start, start + rows)
            piece_loss, logit_grad = _piece_loss_and_logit_grad(
                hidden[piece], weight_c, bias_c, target_ids[piece], scale, any(needs_grad), logits_buffer
            )
            loss += piece_loss
            if logit_grad is None:
                continue
            logit_grad_c = logit_grad.to(dtype)
            if needs_grad[0]:
                hidden_grad_pieces.append(logit_grad_c @ weight_c)
            if weight_grad is not None:
                if weight_grad.dtype == dtype:  # summed inside the matmul: 1.5x faster than += a product
                    weight_grad.addmm_(logit_grad_c.t(), hidden[piece])
                else:  # half precision products, summed in float32
                    weight_grad += logit_grad_c.t() @ hidden[piece]
            if bias_grad is not None:
                bias_grad += logit_grad.sum(0)
    return (
        loss * scale,
        torch.cat(hidden_grad_pieces).to(hidden_states.dtype) if needs_grad[0] else None,
        None if weight_grad is None else weight_grad.to(weight.dtype),
        None if bias_grad is None else bias_grad.to(bias.dtype),
    )


# The loss and its gradients as one operator: torch.compile keeps it opaque, one call in the graph, where tracing
# into the piece loop unrolled it and ran it slower than eager (docs/speed.md). Named after this module, so that a
# copy of it loaded as Hub custom code registers an operator of its own.
_OPERATOR = "twotower::" + re.sub(r"\W", "_", __name__) + "_loss_and_grads"


@torch.library.custom_op(_OPERATOR, mutates_args=())
def _loss_and_grads_operator(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    target_ids: torch.Tensor,
    num_items: torch.Tensor,
    rows: int,
    dtype: torch.dtype,
    needs_grad: list[bool],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """`_loss_and_grads`, a gradient not asked for returned empty (an operator returns tensors only)."""
    loss, *grads = _loss_and_grads(hidden_states, weight, bias, target_ids, num_items, rows, dtype, needs_grad)
    tensors = (hidden_states, weight, bias)
    return loss, *(tensor.new_empty(0) if grad is None else grad for grad, tensor in zip(grads, tensors))


@_loss_and_grads_operator.register_fake
def _(hidden_states, weight, bias, target_ids, num_items, rows, dtype, needs_grad):
    loss = hidden_states.new_empty((), dtype=torch.promote_types(dtype, torch.float32))
    tensors = (hidden_states, weight, bias)
    grads = (torch.empty_like(tensor) if need else tensor.new_empty(0) for tensor, need in zip(tensors, needs_grad))
    return loss, *grads


def _loss_and_grads_flops(hidden_shape, weight_shape, bias_shape, targets_shape, num_items_shape, rows, dtype,
                          needs_grad, out_shape=None) -> int:  # fmt: skip
    # torch's FLOP counter sees the operator, not the matmuls inside it: the logits' and each asked-for gradient's,
    # 2 * tokens * hidden * vocab FLOPs each (the softmax counts as elementwise work does: nothing)
    matmuls = 1 + needs_grad[0] + needs_grad[1]
    return 2 * hidden_shape[0] * hidden_shape[1] * weight_shape[0] * matmuls


try:
    register_flop_formula(getattr(torch.ops.twotower, _OPERATOR.split("::")[1]))(_loss_and_grads_flops)
except RuntimeError:  # the module run again (importlib.reload): its operator's formula is registered already
    pass


def _call_operator(hidden_states, weight, bias, target_ids, num_items, rows, needs_grad):
    # the operator takes tensors and plain values only: num_items as a tensor, autocast's dtype read here
    num_items = torch.as_tensor(num_items, device=hidden_states.device)
    dtype = _compute_dtype(hidden_states)
    return _loss_and_grads_operator(hidden_states, weight, bias, target_ids, num_items, rows, dtype, needs_grad)


class LinearCrossEntropy(torch.autograd.Function):
    """`linear_cross_entropy` under autograd: forward returns the loss and keeps its gradients for backward."""

    @staticmethod
    def forward(ctx, hidden_states, weight, bias, target_ids, num_items, rows):
        needs_grad = list(ctx.needs_input_grad[:3])
        loss, *grads = _call_operator(hidden_states, weight, bias, target_ids, num_items, rows, needs_grad)
        ctx.save_for_backward(*(grad if need else None for grad, need in zip(grads, needs_grad)))
        return loss

    @staticmethod
    def backward(ctx, loss_grad):
        return tuple(None if grad is None else grad * loss_grad for grad in ctx.saved_tensors) + (None, None, None)


def linear_cross_entropy(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    target_ids: torch.LongTensor,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> torch.Tensor:
    """
    `fixed_cross_entropy(hidden_states @ weight.T + bias, target_ids, num_items_in_batch)` (transformers' LM loss:
    the token mean over targets that are not -100, or their sum divided by `num_items_in_batch`) to float
    tolerance, computed in pieces of rows so that the [tokens, vocab] logits never exist at once. Under autograd
    each piece's gradients are computed in the forward pass (3 matmuls a piece, as an unfused backward) and
    backward only scales them.

    hidden_states: [tokens, hidden]; weight: [vocab, hidden]; bias: [vocab]; target_ids: [tokens].
    """
    hidden_states = hidden_states.reshape(-1, hidden_states.shape[-1])
    target_ids = target_ids.reshape(-1)
    num_items = target_ids.ne(-100).sum() if num_items_in_batch is None else num_items_in_batch
    rows = piece_rows(hidden_states.shape[0], hidden_states.shape[1], weight.shape[0])
    if torch.is_grad_enabled() and any(t.requires_grad for t in (hidden_states, weight, bias)):
        return LinearCrossEntropy.apply(hidden_states, weight, bias, target_ids, num_items, rows)
    return _call_operator(hidden_states, weight, bias, target_ids, num_items, rows, [False] * 3)[0]


__all__ = ["linear_cross_entropy"]
