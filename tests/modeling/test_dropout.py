"""The package's dropout (dropout.py) against `nn.Dropout`: the same masks, values and gradients from a seed, eager
and compiled on the CPU; that every kind's model uses it: tests/modeling/test_kind_conformance.py."""

import shutil

import pytest
import torch
import torch._inductor.config
from torch import nn
from torch._inductor.utils import run_and_get_code

from modeling_twotower.dropout import Dropout


def inputs(dtype, layout):
    states = torch.randn(4, 33, 10, generator=torch.Generator().manual_seed(0)).to(dtype)
    states = states.transpose(1, 2) if layout == "transposed" else states  # a view, as attention outputs are
    return states.detach().requires_grad_()


def dropped(module, states, seed=0):
    leaf = states.detach().clone().requires_grad_()  # clone keeps the layout
    torch.manual_seed(seed)
    output = module.train()(leaf)
    output.backward(torch.arange(output.numel(), dtype=output.dtype).view_as(output))
    return output.detach(), leaf.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize("layout", ["contiguous", "transposed"])
def test_eager_values_and_gradients_are_nn_dropouts_to_the_bit(dtype, p, layout):
    states = inputs(dtype, layout)
    expected, actual = dropped(nn.Dropout(p), states), dropped(Dropout(p), states)
    assert all(torch.equal(a, b) for a, b in zip(actual, expected))
    assert actual[0].stride() == expected[0].stride()
    dropped_share = float((actual[0] == 0).float().mean())
    assert abs(dropped_share - p) < 0.1  # 1,320 draws
    torch.testing.assert_close(actual[0][actual[0] != 0], (states[actual[0] != 0] / (1 - p)).detach())


def test_off_in_eval_and_at_rate_zero():
    states = inputs(torch.float32, "contiguous")
    assert torch.equal(Dropout(0.3).eval()(states), states)
    assert torch.equal(Dropout(0.0).train()(states), states)


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@pytest.mark.parametrize("fallback_random", [False, True])  # inductor's default; what the training command sets
def test_compiled_on_the_cpu_it_draws_the_eager_masks_with_atens_bernoulli(fallback_random):
    states = inputs(torch.float32, "contiguous").detach()
    torch.manual_seed(3)
    eager = Dropout(0.3).train()(states) * 2 + 1
    torch.manual_seed(3)
    with torch._inductor.config.patch(fallback_random=fallback_random):
        compiled_fn = torch.compile(lambda t: Dropout(0.3).train()(t) * 2 + 1, dynamic=False)
        compiled, (code, *_) = run_and_get_code(compiled_fn, states)
    assert torch.equal(compiled, eager)
    assert "bernoulli_" in code and "native_dropout" not in code  # the bulk draw, not one opaque dropout call
