"""The per-tower LayerNorm's autograd function against the composite it replaces: the same values and gradients to the
bit, in every dtype, rank, autocast state and combination of requested gradients, differentiable twice, and keeping
nothing of the input's size for backward but the input itself."""

import itertools

import pytest
import torch

from modeling_twotower.batched_layers import BatchedLayerNorm, TwoTowerBatchedLayerNorm, _batched_layer_norm

EPS = 1e-5
# [towers, batch, seq, hidden], [towers, tokens, hidden], [towers, hidden]; widths that fill the CPU's vectors and
# widths that leave a remainder
SHAPES = [(2, 5, 7, 16), (3, 11, 16), (2, 16), (2, 3, 9, 128), (2, 4, 33, 100), (3, 6, 48)]
CASES = [  # (input dtype, parameter dtype, autocast): autocast casts the LayerNorm to float32, not the bfloat16 input
    (torch.float32, torch.float32, False),
    (torch.float64, torch.float64, False),
    (torch.bfloat16, torch.float32, True),
]


def run(function, inputs, needs_grad, output_grad, autocast):
    leaves = [t.clone().requires_grad_(needed) for t, needed in zip(inputs, needs_grad)]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        output = function(*leaves, EPS)
    if any(needs_grad):
        output.backward(output_grad)
    return [output.detach()] + [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype, parameter_dtype, autocast", CASES)
def test_values_and_gradients_are_the_composites_to_the_bit(shape, dtype, parameter_dtype, autocast):
    generator = torch.Generator().manual_seed(0)
    hidden_states = torch.randn(shape, generator=generator).to(dtype)
    weight, bias = torch.randn(2, shape[0], shape[-1], generator=generator).to(parameter_dtype)
    output_grad = torch.randn(shape, generator=generator).to(parameter_dtype)
    for needs_grad in itertools.product([False, True], repeat=3):
        inputs = (hidden_states, weight, bias)
        expected = run(_batched_layer_norm, inputs, needs_grad, output_grad, autocast)
        actual = run(BatchedLayerNorm.apply, inputs, needs_grad, output_grad, autocast)
        for want, got in zip(expected, actual):
            assert (want is None) == (got is None), needs_grad
            if want is not None:
                assert got.dtype == want.dtype and torch.equal(got, want), needs_grad


def test_gradients_of_gradients():
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
              for shape in ((2, 3, 4, 6), (2, 6), (2, 6))]

    def layer_norm(*tensors):
        return BatchedLayerNorm.apply(*tensors, EPS)

    assert torch.autograd.gradcheck(layer_norm, inputs)
    assert torch.autograd.gradgradcheck(layer_norm, inputs)


def saved_for_backward(function, hidden_states, norm):
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        function(hidden_states, norm.weight, norm.bias, EPS)
    return saved


def test_backward_keeps_only_the_input_of_its_size():
    norm = TwoTowerBatchedLayerNorm(2, 16, EPS)
    hidden_states = torch.randn(2, 4, 8, 16, requires_grad=True)
    composite = saved_for_backward(_batched_layer_norm, hidden_states, norm)
    function = saved_for_backward(BatchedLayerNorm.apply, hidden_states, norm)
    full_size = [t for t in composite if t.shape == hidden_states.shape]
    assert any(t.data_ptr() != hidden_states.data_ptr() for t in full_size)  # the composite kept the normalized states
    assert [t for t in function if t.shape == hidden_states.shape][0].data_ptr() == hidden_states.data_ptr()
    assert sum(t.shape == hidden_states.shape for t in function) == 1
