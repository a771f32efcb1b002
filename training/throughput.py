"""Tokens per second and model FLOPs utilization (MFU): the FLOPs per token counted from the model config, and the
peak FLOP/s of the device that MFU divides by."""

import time

import torch

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


def _tower_weights(config) -> int:
    """Matmul weights of all towers: each tower's projection from the shared embedding (if any), then its layers."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    layout = getattr(config, "layout", "bert")  # configs from before layouts: bert
    if layout == "elmo":
        # per tower: one projection applied to both directions, then per direction an unprojected LSTM (input and
        # recurrent weights into the 4 gates of every cell) and a Linear from the cells back to half the width
        half, cells = hidden // 2, config.lstm_hidden_size
        lstm = 4 * cells * (half + cells) + (layers - 1) * 4 * cells * 2 * cells
        return config.num_towers * (2 * config.embedding_size * half + 2 * (lstm + cells * half))
    if config.tower_type == "lstm":
        # input and recurrent weights into the 4 gates of every cell, then the projection back to the tower width
        per_layer = 8 * config.lstm_hidden_size * hidden + config.lstm_hidden_size * hidden
        if config.bidirectional:  # ELMo-style: a backward stack too, and [left; right] context -> tower width
            layers, context_proj = 2 * layers, 2 * hidden * hidden
            return config.num_towers * (config.embedding_size * hidden + layers * per_layer + context_proj)
    else:
        per_layer = 4 * hidden * hidden + 2 * hidden * config.intermediate_size  # q, k, v, o; MLP up and down
    projection = 0 if layout == "gpt" else config.embedding_size * hidden  # gpt towers read the embedding as it is
    return config.num_towers * (projection + layers * per_layer)


def _probe_shaped_weights(config, num_heads: int, probe_type: str = "mlp") -> int:
    """Matmul weights of `num_heads` probe-shaped heads: a dense layer (mlp), then the untied vocabulary projection."""
    width = getattr(config, "probe_hidden_size", config.hidden_size) if probe_type == "mlp" else config.hidden_size
    dense = config.hidden_size * width if probe_type == "mlp" else 0
    return num_heads * (dense + width * config.vocab_size)


def flops_per_token(config, block_size: int, phase: str) -> float:
    """
    Model FLOPs to train on one token, nanoGPT's estimate (PaLM appendix B): 6 per matmul weight for forward +
    backward, plus 12 * layers * width * context for attention scores, summed over towers. Embedding lookups are
    free; the tied decoder is counted through lm_head (the independent-towers control has one untied head per
    tower instead of the fusion head). In the probe phase the frozen towers ran once, before training, to cache
    their features, so a step trains only the probes: 6 per weight of every probe (each replica of each tower),
    per cached position. LSTM towers count a backward stack where `config.bidirectional` is set (the training
    command saves it in every model's config).
    """
    if phase == "probe":
        return 6 * _probe_shaped_weights(config, config.num_probes, config.probe_type)
    attention = 0
    if config.tower_type != "lstm":
        attention = config.num_hidden_layers * config.num_towers * config.hidden_size * block_size
    fusion_and_decoder = (config.fused_hidden_size + config.vocab_size) * config.embedding_size
    head = fusion_and_decoder if config.cooperative else _probe_shaped_weights(config, config.num_towers)
    return 6 * (_tower_weights(config) + head) + 12 * attention


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
