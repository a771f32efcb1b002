"""Tokens per second and model FLOPs utilization (MFU), with the FLOPs per token counted from the model config."""

import time

import torch


def _tower_weights(config) -> int:
    """Matmul weights of all towers: each tower's projection from the shared embedding, then its layers."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    if config.tower_type == "lstm":
        # input and recurrent weights into the 4 gates of every cell, then the projection back to the tower width
        per_layer = 8 * config.lstm_hidden_size * hidden + config.lstm_hidden_size * hidden
        if config.bidirectional:  # ELMo-style: a backward stack too, and [left; right] context -> tower width
            layers, context_proj = 2 * layers, 2 * hidden * hidden
            return config.num_towers * (config.embedding_size * hidden + layers * per_layer + context_proj)
    else:
        per_layer = 4 * hidden * hidden + 2 * hidden * config.intermediate_size  # q, k, v, o; MLP up and down
    return config.num_towers * (config.embedding_size * hidden + layers * per_layer)


def _probe_shaped_weights(config, num_heads: int, probe_type: str = "mlp") -> int:
    """Matmul weights of `num_heads` probe-shaped heads: a dense layer (mlp), then the untied vocabulary projection."""
    dense = config.hidden_size * config.hidden_size if probe_type == "mlp" else 0
    return num_heads * (dense + config.hidden_size * config.vocab_size)


def flops_per_token(config, block_size: int, phase: str) -> float:
    """
    Model FLOPs to train on one token, nanoGPT's estimate (PaLM appendix B): 6 per matmul weight for forward +
    backward, plus 12 * layers * width * context for attention scores, summed over towers. Embedding lookups are
    free; the tied decoder is counted through lm_head (the independent-towers control has one untied head per
    tower instead of the fusion head). In the probe phase the frozen towers ran once, before training, to cache
    their features, so a step trains only the probes: 6 per weight of every probe (each replica of each tower),
    per cached position.
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


def throughput_metrics(
    tokens: int, seconds: float, flops_per_token: float, peak_flops_per_device: float, num_processes: int
) -> dict:
    """{"tokens_per_s", "mfu"} for `tokens` processed (all processes together) in `seconds`."""
    tokens_per_s = tokens / seconds
    mfu = tokens_per_s * flops_per_token / (peak_flops_per_device * num_processes)
    return {"tokens_per_s": tokens_per_s, "mfu": mfu}
