"""What the training command sets when it compiles: on the CPU, compiled dropout draws eager ATen masks."""

import shutil

import pytest
import torch
import torch._inductor.config
from torch.nn import functional as F

from twotower.training.launch.compilation import draw_random_eagerly_on_cpu


@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None, reason="inductor needs a C++ compiler")
@torch._inductor.config.patch(fallback_random=False)
def test_compiled_dropout_on_the_cpu_draws_the_eager_masks():
    draw_random_eagerly_on_cpu(torch.device("cpu"))
    assert torch._inductor.config.fallback_random
    x = torch.ones(64, 33)
    torch.manual_seed(0)
    eager = F.dropout(x, 0.3) * 2 + 1
    torch.manual_seed(0)
    compiled = torch.compile(lambda t: F.dropout(t, 0.3) * 2 + 1, dynamic=False)(x)
    assert torch.equal(compiled, eager)  # the same mask, so compiled training follows the eager run's randomness
    assert 0.2 < float((eager == 1).float().mean()) < 0.4


@torch._inductor.config.patch(fallback_random=False)
def test_gpus_keep_inductors_own_random_draws():
    draw_random_eagerly_on_cpu(torch.device("cuda"))
    assert not torch._inductor.config.fallback_random
