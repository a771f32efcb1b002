"""
Selective state-space towers (`tower_type="ssm"`), Mamba-style: per tower and depth a pre-norm residual block around
transformers' own `MambaMixer` (gated input projection, causal depthwise convolution, input-dependent time step, B
and C, then the selective scan), whose PyTorch path runs on the CPU; each tower ends with its own LayerNorm (Mamba's
norm_f). Causal (`bidirectional=False`): position t has read tokens <= t. Bidirectional (the masked family): each
tower also runs a backward stack on the reversed sequence, and position t combines the forward state at t - 1 with
the backward state at t + 1, as the LSTM towers do, so the prediction for token t never reads token t.

Each tower is its own MambaMixer, so the towers run one after the other. The towers keep no state cache:
generation recomputes the prefix at every step.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F
from transformers import MambaConfig
from transformers.models.mamba.modeling_mamba import MambaMixer

from .batched_layers import TwoTowerBatchedLayerNorm
from .dropout import Dropout
from .reference_initialization import torch_default_
from .tower_stack import KindInitialized, TowerStack, stack_output

if TYPE_CHECKING:  # the config reads the kinds (its choices), so a kind names the config in annotations only
    from .configuration_twotower import TwoTowerConfig

SSM_STATE_SIZE = 16  # Mamba's N: the state per channel
CONV_KERNEL = 4  # Mamba's causal convolution width


def mamba_config(config: TwoTowerConfig) -> MambaConfig:
    """The mixers' config: one tower's width, `intermediate_size` channels (Mamba's expanded width), no biases in
    the projections (Mamba's defaults), the sequential scan (the associative one needs torch.compile)."""
    mamba = MambaConfig(
        hidden_size=config.hidden_size, state_size=SSM_STATE_SIZE, conv_kernel=CONV_KERNEL,
        num_hidden_layers=config.num_hidden_layers, layer_norm_epsilon=config.layer_norm_eps,
        use_associative_scan=False,
    )  # fmt: skip
    mamba.intermediate_size = config.intermediate_size
    return mamba


def scan_chunk(seq_len: int) -> int:
    """
    Positions a chunk of the scan holds: the power of two with the fewest sequential steps, `chunk + ceil(seq_len /
    chunk)`, the larger on a tie. The scan runs every chunk at once, one position of each per step, then carries the
    state from chunk to chunk, a whole chunk at a time, and on the CPU each step costs about the same whatever its
    size. Timed on the CPU (benchmarks/bench_ssm_tower.py, docs/speed.md), the scan was fastest, or within the spread
    of the fastest, in the rule's chunks at 64, 128, 256 and 512 positions: 8, 16, 16 and 32.
    """
    chunks = (2**power for power in range(max(1, seq_len).bit_length()))
    return min(chunks, key=lambda chunk: (chunk + -(-seq_len // chunk), -chunk))


def _in_chunks(tensor: torch.Tensor, chunk: int) -> torch.Tensor:
    # [batch, seq, ...] -> [batch, chunks, chunk, ...], zero-padded at the end
    padding = -tensor.shape[1] % chunk
    if padding:
        tensor = F.pad(tensor, (0, 0) * (tensor.dim() - 2) + (0, padding))
    return tensor.unflatten(1, (-1, chunk))


def _pieces(seq_len: int, piece: int) -> list[slice]:
    return [slice(start, min(start + piece, seq_len)) for start in range(0, seq_len, piece)]


def chunked_scan_(
    time_step: torch.Tensor,
    A: torch.Tensor,
    inputs: torch.Tensor,
    chunk: int,
    work: torch.Tensor,
    reverse: bool = False,
) -> torch.Tensor:
    """
    The states of the recurrence state_t = exp(time_step_t * A) * state_{t-1} + inputs_t from a zero state (with
    `reverse`, state_{t+1} instead of state_{t-1}, from the end), time_step [batch, seq, channels], A [channels, N],
    inputs [batch, seq, channels, N] -> [batch, seq, channels, N], written over `inputs` (over its zero-padded copy
    where `seq` is not a multiple of `chunk`). Each chunk's states start from zero, every chunk at once; then, chunk
    after chunk, the state leaving one chunk is added to the next one's, decayed by exp(A * the time steps summed from
    the chunk's entry): sums of time steps in log space, whose exponentials never exceed 1 (A < 0), where dividing by
    cumulative products of decays would underflow. `work` ([batch, chunk, channels, N]) holds a chunk's decays: on
    the CPU a fresh [batch, seq, channels, N] tensor costs more in page faults than the exponentials themselves.
    """
    seq_len = inputs.shape[1]
    time_step, states = _in_chunks(time_step, chunk), _in_chunks(inputs, chunk)  # [b, K, T, c], [b, K, T, c, N]
    A = A * math.log2(math.e)  # exp(x) as exp2(x * log2(e)): exp2 took a quarter of exp's time on the CPU
    order = range(chunk - 1, -1, -1) if reverse else range(chunk)
    position_states, position_steps = states.unbind(2), time_step[..., None].unbind(2)  # per position, every chunk
    decays = torch.empty_like(position_states[0])
    state = position_states[order[0]]  # from a zero state the first state is the first input
    for t in order[1:]:
        state = position_states[t].addcmul_(torch.mul(position_steps[t], A, out=decays).exp2_(), state)
    num_chunks = states.shape[1]
    if num_chunks > 1:
        entered = time_step.flip(2).cumsum(2).flip(2) if reverse else time_step.cumsum(2)
        chunks = range(num_chunks - 1, -1, -1) if reverse else range(num_chunks)
        for previous, k in zip(chunks, chunks[1:]):  # `previous` already holds its whole states
            chunk_decays = torch.mul(entered[:, k, :, :, None], A, out=work).exp2_()
            states[:, k].addcmul_(chunk_decays, states[:, previous, order[-1], None])
    return states.flatten(1, 2)[:, :seq_len]


class SelectiveScan(torch.autograd.Function):
    """
    Mamba's selective scan, y_t = state_t @ C_t with state_t = exp(time_step_t * A) * state_{t-1} + time_step_t *
    channels_t * B_t (time_step, channels [batch, seq, channels]; A [channels, N]; B, C [batch, seq, N]), by
    `chunked_scan_` both ways, in chunks of `scan_chunk(seq)` positions unless `chunk` is given: backward is the same
    scan run from the end over the loss's gradients. Written by hand so that a call allocates one [batch, seq,
    channels, N] tensor forward and one backward (autograd over the scan kept a dozen, and on the CPU each fresh one
    costs its page faults). The readout and the gradients of B, C and the channels are matrix products over each
    position's [channels, N] states, which read the states once and write no product; the gradients that weigh each
    channel's states by A or by its time step go through one buffer of a chunk's size, a chunk at a time.
    """

    @staticmethod
    def forward(ctx, time_step, A, B, C, channels, chunk=None):
        # in the inputs' dtype under autocast too: backward, which runs outside autocast, meets the same dtypes
        chunk = chunk or scan_chunk(time_step.shape[1])
        with torch.autocast(time_step.device.type, enabled=False):
            inputs = (time_step * channels)[..., None] * B[:, :, None]
            work = inputs.new_empty((inputs.shape[0], chunk) + inputs.shape[2:])
            states = chunked_scan_(time_step, A, inputs, chunk, work)
            ctx.save_for_backward(time_step, A, B, C, channels, states)
            ctx.chunk = chunk
            return (states @ C[..., None]).squeeze(-1)

    @staticmethod
    def backward(ctx, output_grad):
        time_step, A, B, C, channels, states = ctx.saved_tensors
        driven = time_step * channels
        work = states.new_empty((states.shape[0], ctx.chunk) + states.shape[2:])
        # d loss / d state_t = output_grad_t C_t + exp(time_step_{t+1} * A) * d loss / d state_{t+1}
        next_time_step = F.pad(time_step[:, 1:], (0, 0, 0, 1))
        readout_grad = output_grad[..., None] * C[:, :, None]
        state_grad = chunked_scan_(next_time_step, A, readout_grad, ctx.chunk, work, reverse=True)
        driven_grad = (state_grad @ B[..., None]).squeeze(-1)  # [batch, seq, channels]
        B_grad = (driven[:, :, None] @ state_grad).squeeze(2)  # [batch, seq, N]
        C_grad = (output_grad[:, :, None] @ states).squeeze(2)
        time_step_grads, A_grad = [], torch.zeros_like(A)
        for p in _pieces(states.shape[1], ctx.chunk):
            # d state_t / d (time_step_t * A) = exp(time_step_t * A) * state_{t-1} = state_t - inputs_t
            inputs = torch.mul(driven[:, p, :, None], B[:, p, None], out=work[:, : p.stop - p.start])
            log_decay_grad = state_grad[:, p].mul_(torch.sub(states[:, p], inputs, out=inputs))
            time_step_grads.append(_summed(log_decay_grad, A, work, -1))
            A_grad += _summed(log_decay_grad, time_step[:, p, :, None], work, (0, 1))
        time_step_grad = torch.cat(time_step_grads, dim=1).addcmul_(driven_grad, channels)
        return time_step_grad, A_grad, B_grad, C_grad, driven_grad * time_step, None


def _summed(states: torch.Tensor, factor: torch.Tensor, work: torch.Tensor, dim) -> torch.Tensor:
    """(states * factor).sum(dim), the product in `work` (a chunk of positions); states [batch, positions <= chunk,
    channels, N]."""
    product = torch.mul(states, factor, out=work[:, : states.shape[1]])
    if dim == -1:  # over the N states of a channel as a product with a column of ones: sum(-1) took twice its time on
        # the CPU; a column, not a vector, keeps it a matmul (torch's FLOP counter has no formula for `mv`, which a
        # vector takes wherever the product is contiguous)
        return (product @ product.new_ones(product.shape[-1], 1)).squeeze(-1)
    return product.sum(dim)


def causal_depthwise_conv(channels: torch.Tensor, conv: nn.Conv1d) -> torch.Tensor:
    """MambaMixer's causal depthwise convolution (`conv`'s weights, padded by kernel - 1 and cut to the sequence), as
    one product per tap over [batch, seq, channels]: on the CPU, forward and backward took half the time of
    `conv1d` over the transposed channels, whose layout also slowed the activation's backward."""
    seq_len, kernel_size = channels.shape[1], conv.kernel_size[0]
    padded = F.pad(channels, (0, 0, kernel_size - 1, 0))  # [batch, kernel - 1 + seq, channels]
    taps = conv.weight[:, 0]  # [channels, kernel]
    output = padded[:, :seq_len] * taps[:, 0]
    for tap in range(1, kernel_size):
        output = output.addcmul_(padded[:, tap : tap + seq_len], taps[:, tap])
    return output if conv.bias is None else output + conv.bias


class TwoTowerMambaMixer(MambaMixer, KindInitialized):
    """transformers' MambaMixer (its weights and initialisation), run over whole sequences by `forward` below: the
    reference path's arithmetic, with the chunked scan of `SelectiveScan` and the convolution of
    `causal_depthwise_conv`; no cache."""

    def init_kind_weights(self, config) -> None:
        # Mamba's own draws for the state matrix A, the skip D and the time step's projection and bias, after the
        # generic init of the Linear layers (a zero time-step bias would start every channel at dt = softplus(0))
        self.init_mamba_weights()

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """hidden_states [batch, seq, hidden] -> [batch, seq, hidden]; padding (attention_mask 0) is zeroed before
        the projection and the scan, as in MambaMixer."""
        dtype = hidden_states.dtype
        mask = None if attention_mask is None else attention_mask[:, :, None].to(dtype)
        if mask is not None:
            hidden_states = hidden_states * mask
        channels, gate = self.in_proj(hidden_states).chunk(2, dim=-1)  # [batch, seq, channels] each
        channels = self.act(causal_depthwise_conv(channels, self.conv1d))
        if mask is not None:
            channels = channels * mask
        time_step, B, C = torch.split(
            self.x_proj(channels), [self.time_step_rank, self.ssm_state_size, self.ssm_state_size], dim=-1
        )
        time_step = F.softplus(self.dt_proj(time_step))  # [batch, seq, channels]
        scan_dtype = torch.promote_types(dtype, torch.float32)  # as the reference path: at least float32
        A = -torch.exp(self.A_log.to(scan_dtype))  # [channels, N]
        scan_output = SelectiveScan.apply(*(tensor.to(scan_dtype) for tensor in (time_step, A, B, C, channels)))
        scan_output = (scan_output + channels * self.D) * F.silu(gate)
        return self.out_proj(scan_output.to(dtype))


class TwoTowerSSMBlock(nn.Module):
    """One tower's layer: x + dropout(MambaMixer(LayerNorm(x))), hidden states [batch, seq, hidden]."""

    def __init__(self, config: TwoTowerConfig, layer_idx: int):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mixer = TwoTowerMambaMixer(mamba_config(config), layer_idx)
        self.dropout = Dropout(config.hidden_dropout)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        # the mixer zeroes padding (attention_mask 0) before its projection and its scan
        return hidden_states + self.dropout(self.mixer(self.norm(hidden_states), attention_mask=attention_mask))


def _reference_convolution_(module: nn.Conv1d, config: TwoTowerConfig) -> None:
    # torch's Conv1d default, as Mamba's reference code keeps it: U(+-1/sqrt(fan_in)) for weight and bias, fan_in
    # the kernel's taps of one channel (depthwise)
    torch_default_(module.weight, module.bias, module.weight[0].numel())


def _tower_stacks(config: TwoTowerConfig) -> nn.ModuleList:
    # [towers][layers]
    layers = range(config.num_hidden_layers)
    return nn.ModuleList(
        [nn.ModuleList([TwoTowerSSMBlock(config, i) for i in layers]) for _ in range(config.num_towers)]
    )


def _run(blocks: nn.ModuleList, hidden_states: torch.Tensor, attention_mask) -> torch.Tensor:
    for block in blocks:
        hidden_states = block(hidden_states, attention_mask)
    return hidden_states


class TwoTowerSSMTowers(TowerStack):
    """Every tower's stack of `TwoTowerSSMBlock`s, a backward one too when bidirectional; [towers, batch, seq, hidden]
    in and out."""

    tower_type = "ssm"
    layouts = ("bert",)
    size_fields = ("intermediate_size",)
    kind_name = "state-space"
    no_split_module = "TwoTowerSSMTowers"
    # the mixers' Linear layers (bias-free but dt_proj) draw as every Linear does; A, D and the time step's
    # projection Mamba's own way after them (TwoTowerMambaMixer.init_kind_weights)
    reference_initializers = {nn.Conv1d: _reference_convolution_}
    card_names = {
        False: "causal selective state-space (Mamba-style)",
        True: "forward + backward selective state-space (Mamba-style)",
    }
    card_size_rows = (("Mixer channels per layer (`intermediate_size`, Mamba's expanded width)", "intermediate_size"),)
    card_limitations = {
        direction: "The towers are selective state-space stacks (Mamba-style), a family the paper does not study "
        "(it predates Mamba); the preference it reports need not carry over to them."
        for direction in (False, True)
    }
    card_tags = ("ssm", "mamba")

    @classmethod
    def card_architecture(cls, config: TwoTowerConfig, bidirectional: bool) -> str:
        blocks = (
            "pre-LayerNorm residual blocks around a selective state-space mixer (Mamba's: a gated input projection, "
            f"a causal depthwise convolution, an input-dependent time step, B and C, then the scan over a state of "
            f"{SSM_STATE_SIZE} per channel)"
        )
        if bidirectional:
            return (
                f"a forward and a backward stack of {blocks}; position t joins the forward stack at t - 1 and the "
                "backward stack at t + 1 (never token t itself) under the tower's own LayerNorm"
            )
        return f"a stack of {blocks}, ending in the tower's own LayerNorm"

    def __init__(self, config: TwoTowerConfig, bidirectional: bool):
        super().__init__()
        self.bidirectional = bidirectional
        self.forward_blocks = _tower_stacks(config)
        if bidirectional:
            self.backward_blocks = _tower_stacks(config)
            # [left; right] context of one tower -> its width, one Linear per tower
            self.context_proj = nn.ModuleList(
                [nn.Linear(2 * config.hidden_size, config.hidden_size) for _ in range(config.num_towers)]
            )
        self.tower_norm = TwoTowerBatchedLayerNorm(config.num_towers, config.hidden_size, config.layer_norm_eps)
        # multiply-adds per token of one contraction over all of a token's states (channels x N), every tower and layer
        self.state_products = config.num_towers * config.num_hidden_layers * config.intermediate_size * SSM_STATE_SIZE

    def forward(self, hidden_states: torch.Tensor, output_hidden_states: bool = False, **attention_inputs):
        # of the attention inputs only the padding mask applies; no cache, no positions
        attention_mask = attention_inputs.get("attention_mask")
        outputs = []
        for tower_idx, forward_blocks in enumerate(self.forward_blocks):
            tower_inputs = hidden_states[tower_idx]  # [batch, seq, hidden]
            left_to_right = _run(forward_blocks, tower_inputs, attention_mask)
            if not self.bidirectional:
                outputs.append(left_to_right)
                continue
            reversed_mask = None if attention_mask is None else attention_mask.flip(1)
            right_to_left = _run(self.backward_blocks[tower_idx], tower_inputs.flip(1), reversed_mask).flip(1)
            left_context = F.pad(left_to_right[:, :-1], (0, 0, 1, 0))  # state after t - 1; zeros at t = 0
            right_context = F.pad(right_to_left[:, 1:], (0, 0, 0, 1))  # state after t + 1; zeros at the end
            outputs.append(self.context_proj[tower_idx](torch.cat([left_context, right_context], dim=-1)))
        return stack_output(self.tower_norm(torch.stack(outputs)), output_hidden_states)

    def extra_flops_per_token(self, block_size: int) -> int:
        # the scan's contractions over the states, 2 FLOPs per multiply-add, per direction: the readout forward, and
        # backward the gradients of C, B, the channels and the time step (SelectiveScan); its elementwise updates
        # count as norms do: nothing
        return 2 * 5 * self.state_products * (2 if self.bidirectional else 1)


__all__ = ["TwoTowerSSMTowers"]
