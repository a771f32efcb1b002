"""The selective state-space towers' own mixer and scan (`tower_type="ssm"`, towers_ssm.py); what every kind does
(train, save, load as Hub custom code, generate, probe, score, count FLOPs): tests/modeling/test_kind_conformance.py."""

import pytest
import torch
from torch.nn import functional as F
from transformers.models.mamba.modeling_mamba import MambaMixer

from modeling_twotower import TwoTowerConfig
from modeling_twotower.towers_ssm import (
    SelectiveScan,
    TwoTowerMambaMixer,
    causal_depthwise_conv,
    mamba_config,
    scan_chunk,
)

TOLERANCES = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def sequential_scan(time_step, A, B, C, channels):
    """The recurrence one position at a time under autograd: state_t = exp(time_step_t * A) * state_{t-1} +
    time_step_t * channels_t * B_t, y_t = C_t . state_t."""
    state = torch.zeros(channels.shape[0], *A.shape, dtype=channels.dtype)  # [batch, channels, N]
    outputs = []
    for t in range(channels.shape[1]):
        step = time_step[:, t, :, None]
        state = torch.exp(step * A) * state + step * channels[:, t, :, None] * B[:, t, None]
        outputs.append((state * C[:, t, None]).sum(-1))
    return torch.stack(outputs, dim=1)


def mixer_like_inputs(seq_len, dtype, time_step_scale=1.0, seed=0):
    """(time_step, A, B, C, channels) as the mixer makes them: softplus time steps, A = -exp(A_log) with Mamba's
    A_log = log(1..N), and the channels of padded positions zeroed (row 1 padded on the right, row 2 on the left)."""
    generator = torch.Generator().manual_seed(seed)
    batch, channels, state_size = 3, 5, 4

    def draw(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    time_step = F.softplus(draw(batch, seq_len, channels) - 2) * time_step_scale
    A = -torch.arange(1, state_size + 1, dtype=torch.float64).expand(channels, -1) * torch.exp(draw(channels, 1) / 4)
    mask = torch.ones(batch, seq_len, dtype=torch.float64)
    mask[1, seq_len // 2 + 1 :] = 0
    mask[2, : seq_len // 3] = 0
    values = (time_step, A, draw(batch, seq_len, state_size), draw(batch, seq_len, state_size),
              draw(batch, seq_len, channels) * mask[..., None])  # fmt: skip
    return [value.to(dtype).requires_grad_() for value in values]


def outputs_and_grads(scan, inputs, output_weights):
    outputs = scan(*inputs)
    return (outputs, *torch.autograd.grad((outputs * output_weights).sum(), inputs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seq_len", [1, 7, 32, 45, 128])
@pytest.mark.parametrize("chunk", [1, 4, 32, None])  # None: the rule's, `scan_chunk(seq_len)`
def test_the_chunked_scan_equals_the_sequential_one_with_gradients(dtype, seq_len, chunk):
    inputs = mixer_like_inputs(seq_len, dtype)
    output_weights = torch.randn(3, seq_len, 5, generator=torch.Generator().manual_seed(1), dtype=dtype)
    chunked = outputs_and_grads(lambda *x: SelectiveScan.apply(*x, chunk), inputs, output_weights)
    sequential = outputs_and_grads(sequential_scan, inputs, output_weights)
    for name, ours, reference in zip(("outputs", "time_step", "A", "B", "C", "channels"), chunked, sequential):
        torch.testing.assert_close(ours, reference, **TOLERANCES[dtype], msg=lambda message: f"{name}: {message}")


def test_the_scan_chunk_takes_the_fewest_sequential_steps():
    def steps(seq_len, chunk):
        return chunk + -(-seq_len // chunk)

    for seq_len in range(1, 4097):
        chunk = scan_chunk(seq_len)
        assert chunk & (chunk - 1) == 0 and chunk <= seq_len
        powers = [2**power for power in range(13) if 2**power <= seq_len]
        assert steps(seq_len, chunk) == min(steps(seq_len, power) for power in powers)
        # and within 7% of the fewest over any chunk length (2 sqrt(seq_len) at best, 2.12 sqrt among powers of 2)
        assert steps(seq_len, chunk) <= 1.07 * min(steps(seq_len, any_chunk) for any_chunk in range(1, seq_len + 1)) + 1
    # the lengths the benchmark timed, where these chunks were the fastest or within the spread (docs/speed.md)
    assert [scan_chunk(seq_len) for seq_len in (64, 128, 256, 512)] == [8, 16, 16, 32]


def test_the_scan_without_a_chunk_runs_in_the_rules_chunks():
    inputs = mixer_like_inputs(45, torch.float32)
    output_weights = torch.randn(3, 45, 5, generator=torch.Generator().manual_seed(1))
    ruled = outputs_and_grads(SelectiveScan.apply, inputs, output_weights)
    explicit = outputs_and_grads(lambda *x: SelectiveScan.apply(*x, scan_chunk(45)), inputs, output_weights)
    other = outputs_and_grads(lambda *x: SelectiveScan.apply(*x, 4), inputs, output_weights)
    assert all(torch.equal(a, b) for a, b in zip(ruled, explicit))
    assert not all(torch.equal(a, b) for a, b in zip(ruled, other))  # the chunking shows in the rounding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_chunked_scan_stays_finite_where_cumulative_decays_underflow(dtype):
    # time steps summing to ~1000 over a chunk: exp(A * 1000) underflows even in float64, which dividing by
    # cumulative decay products would turn into inf or nan; the sequential scan's decays are each representable
    inputs = mixer_like_inputs(4 * 32 + 3, dtype, time_step_scale=200.0)  # chunks of 16: ~1000 over each
    output_weights = torch.randn(3, 4 * 32 + 3, 5, generator=torch.Generator().manual_seed(1), dtype=dtype)
    chunked = outputs_and_grads(SelectiveScan.apply, inputs, output_weights)
    assert all(torch.isfinite(value).all() for value in chunked)
    # float32: A's gradient sums terms 200 times larger, in another order
    tolerance = TOLERANCES[dtype] if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-4)
    for ours, reference in zip(chunked, outputs_and_grads(sequential_scan, inputs, output_weights)):
        torch.testing.assert_close(ours, reference, **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seq_len", [17, 69])
@pytest.mark.parametrize("padded", [False, True])
def test_the_mixer_computes_transformers_reference_mamba_path(dtype, seq_len, padded):
    torch.manual_seed(0)
    mixer = TwoTowerMambaMixer(mamba_config(TwoTowerConfig.from_preset("tiny", tower_type="ssm")), 0).to(dtype)
    mixer.init_mamba_weights()
    hidden_states = torch.randn(3, seq_len, 64, dtype=dtype, requires_grad=True)
    mask = torch.ones(3, seq_len, dtype=torch.long)
    if padded:
        mask[1, 12:] = 0
    names, parameters = zip(*mixer.named_parameters())
    ours = mixer(hidden_states, attention_mask=mask)
    ours_grads = torch.autograd.grad(ours.square().sum(), (hidden_states, *parameters))
    reference = MambaMixer.forward(mixer, hidden_states, attention_mask=mask)
    reference_grads = torch.autograd.grad(reference.square().sum(), (hidden_states, *parameters))
    tolerance = TOLERANCES[dtype] if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours, reference, **tolerance)
    for name, ours_grad, reference_grad in zip(("hidden_states", *names), ours_grads, reference_grads):
        # the reference path takes A_log, D and the time step's bias through `.float()`, so in float64 the weights'
        # gradients, sums over every position, agree to float32's rounding
        close = dict(rtol=1e-6, atol=1e-7) if name != "hidden_states" and dtype == torch.float64 else tolerance
        torch.testing.assert_close(ours_grad, reference_grad, **close, msg=lambda message: f"{name}: {message}")


@pytest.mark.parametrize("kernel_size", [1, 2, 4])
@pytest.mark.parametrize("seq_len", [1, 3, 9])
@pytest.mark.parametrize("bias", [False, True])
def test_the_causal_convolution_equals_conv1d_with_gradients(kernel_size, seq_len, bias):
    torch.manual_seed(0)
    conv = torch.nn.Conv1d(6, 6, kernel_size, groups=6, bias=bias, padding=kernel_size - 1).double()
    channels = torch.randn(2, seq_len, 6, dtype=torch.float64, requires_grad=True)
    output_weights = torch.randn(2, seq_len, 6, dtype=torch.float64)
    inputs = (channels, *conv.parameters())
    ours = causal_depthwise_conv(channels, conv)
    reference = conv(channels.transpose(1, 2))[..., :seq_len].transpose(1, 2)  # MambaMixer's own
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    for ours_grad, reference_grad in zip(
        torch.autograd.grad((ours * output_weights).sum(), inputs),
        torch.autograd.grad((reference * output_weights).sum(), inputs),
    ):
        torch.testing.assert_close(ours_grad, reference_grad, rtol=1e-12, atol=1e-12)
