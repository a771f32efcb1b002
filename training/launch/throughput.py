"""Tokens per second and model FLOPs utilization (MFU): the FLOPs per token counted on the built model, and the
peak FLOP/s of the device that MFU divides by."""

import copy
import time

import torch
from modeling_twotower import TwoTowerForCausalLM, TwoTowerForMaskedLM
from modeling_twotower.batched_layers import TwoTowerBatchedLinear
from torch import nn

# Dense (no sparsity) peaks from NVIDIA's datasheets in TFLOP/s, per matmul format. Matched in order against torch's
# device name, the first key it contains wins: "H100 NVL" and "H100 PCIe" come before "H100".
DATASHEET_PEAK_TFLOPS = (
    ("H200 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H200", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67.0}),
    ("H100 NVL", {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100 PCIe", {"bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0}),
    ("H100", {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67.0}),
    ("A100", {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5}),
)


# Modules whose weights each multiply a token's activations once; embedding lookups are free, and biases and norms
# negligible (nanoGPT's count, which torch's FLOP counter confirms).
MATMUL_MODULES = (nn.Linear, nn.Conv1d, TwoTowerBatchedLinear)


def matmul_weights(module: nn.Module) -> int:
    """The weights of every matmul in `module`: Linear, batched Linear and convolution weights, LSTM weight matrices."""
    count = 0
    for submodule in module.modules():
        if isinstance(submodule, MATMUL_MODULES):
            count += submodule.weight.numel()
        elif isinstance(submodule, nn.LSTM):
            count += sum(param.numel() for name, param in submodule.named_parameters() if name.startswith("weight"))
    return count


def flops_per_token(model, block_size: int, phase: str) -> float:
    """
    Model FLOPs to train on one token, nanoGPT's estimate (PaLM appendix B), counted on the built two-tower LM
    `model`: 6 per matmul weight for forward + backward (the tied decoder once, as lm_head; the towers' own heads where the config has them), plus what its tower
    stack declares beyond its weights (`TowerStack.extra_flops_per_token`: attention scores over `block_size`). In
    the probe phase the frozen towers ran once, before training, to cache their features, so a step trains only the
    probes: 6 per weight of every probe (each replica of each tower), per cached position.
    """
    if phase == "probe":
        return 6 * matmul_weights(model.probes)
    trained = matmul_weights(model.model) + matmul_weights(model.lm_head)
    if model.tower_heads is not None:  # `tower_heads`: each tower's own head and loss beside the joint one
        trained += matmul_weights(model.tower_heads)
    return 6 * trained + model.model.towers.extra_flops_per_token(block_size)


def config_flops_per_token(config, block_size: int, phase: str) -> float:
    """`flops_per_token` of the LM that `config` describes, built on the meta device (no memory, no weights drawn):
    the masked LM if its config is bidirectional (as the training command saves it), else the causal LM."""
    masked = config.bidirectional or config.layout == "elmo"
    with torch.device("meta"):
        model = (TwoTowerForMaskedLM if masked else TwoTowerForCausalLM)(copy.deepcopy(config))
    return flops_per_token(model, block_size, phase)


def measure_peak_flops(device: torch.device, dtype: torch.dtype = torch.float32) -> float:
    """FLOP/s of a large square matmul on `device`: the achievable peak that MFU is measured against."""
    size, repeats = (8192, 20) if device.type != "cpu" else (1024, 10)
    # Constant inputs: measuring must not draw from the RNG that seeds the run.
    a = torch.full((size, size), 0.5, device=device, dtype=dtype)
    b = torch.full((size, size), 0.25, device=device, dtype=dtype)
    a @ b  # warm-up
    _synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    _synchronize(device)
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def _matmul_format(dtype: torch.dtype) -> str | None:
    """The datasheet column of matmuls in `dtype`: float32 ones run as TF32 unless torch keeps them at full fp32."""
    if dtype == torch.float32:
        return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)


def resolve_peak_flops(
    device: torch.device, dtype: torch.dtype = torch.float32, peak_tflops: float | None = None
) -> tuple[float, str]:
    """
    (FLOP/s, where it came from) of the peak that MFU divides by: `peak_tflops` when given, else the datasheet peak
    of a known GPU for matmuls in `dtype`, else the rate of a square matmul measured now (`measure_peak_flops`).
    The second value reads "given ...", "... (datasheet)" or "measured: ...".
    """
    if peak_tflops is not None:
        if peak_tflops <= 0:
            raise ValueError(
                f"--peak_tflops {peak_tflops} must be a positive number of TFLOP/s per device; leave it out to use "
                "the datasheet peak of a known GPU or a measured one."
            )
        return peak_tflops * 1e12, "given with --peak_tflops"
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    matmul_format = _matmul_format(dtype)
    known = [(key, peaks) for key, peaks in DATASHEET_PEAK_TFLOPS if key in name]
    if known and matmul_format is not None:
        key, peaks = known[0]
        return peaks[matmul_format] * 1e12, f"{key} dense {matmul_format} peak (datasheet)"
    return measure_peak_flops(device, dtype), f"measured: {str(dtype)[6:]} square-matmul rate"


def throughput_metrics(
    tokens: int, seconds: float, flops_per_token: float, peak_flops_per_device: float, num_processes: int
) -> dict:
    """{"tokens_per_s", "mfu"} for `tokens` processed (all processes together) in `seconds`."""
    tokens_per_s = tokens / seconds
    mfu = tokens_per_s * flops_per_token / (peak_flops_per_device * num_processes)
    return {"tokens_per_s": tokens_per_s, "mfu": mfu}
