"""What the training command sets when it compiles the model (`--torch_compile`)."""

import torch
import torch._inductor.config


def draw_random_eagerly_on_cpu(device: torch.device) -> None:
    """
    On the CPU, compiled code draws random numbers with ATen's eager kernels. Inductor's own CPU code draws each
    dropout mask element with its own Philox call, a scalar loop that cost more than compiling saved (profiled in
    docs/speed.md); ATen fills a mask in bulk. GPUs keep inductor's fused Philox draws, which are fast there.
    """
    if device.type == "cpu":
        torch._inductor.config.fallback_random = True
