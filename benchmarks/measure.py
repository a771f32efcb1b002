"""How the benchmark measures: step times, peak memory, the device's peak FLOP/s, and the machine it ran on."""

import gc
import os
import platform
import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import accelerate
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from twotower.training.launch.throughput import measure_peak_flops, resolve_peak_flops

INITIAL_PEAK_MEASUREMENTS = 3  # matmul timings before the run; one more after every timing round


def synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        torch.accelerator.synchronize(device)


def release_memory(device: torch.device) -> None:
    """Free what dropped models held, so that the next measurement starts from the same point."""
    gc.collect()
    if device.type != "cpu":
        torch.accelerator.empty_cache()


@dataclass
class Timing:
    seconds: list[float]  # one entry per timed call, after the warm-up calls

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)


def time_calls(call: Callable[[], object], device: torch.device, warmup: int, count: int) -> list[float]:
    """`warmup` untimed calls of `call`, then `count` timed ones: their wall times in seconds."""
    for _ in range(warmup):
        call()
    seconds = []
    for _ in range(count):
        synchronize(device)
        start = time.perf_counter()
        call()
        synchronize(device)
        seconds.append(time.perf_counter() - start)
    return seconds


def time_interleaved(
    calls: dict[str, Callable[[], object]],
    device: torch.device,
    warmup: int,
    repeats: int,
    rounds: int = 1,
    each_round: Callable[[], object] | None = None,
) -> dict[str, Timing]:
    """
    Wall time of `repeats` calls of each of `calls`, in `rounds` rounds. A round runs each call as a block:
    `warmup` untimed calls, then its share of the timed ones. Rounds spread bursts of load from other processes
    over all calls; blocks keep each call's steady state, which alternating single calls would break (on the
    CPU, memory another model just freed must be faulted in again: 15% slower steps for the two-tower model).
    A workload in a process of its own (`own_process.InOwnProcess`) times its blocks there. `each_round`
    (optional) runs after every round.
    """
    seconds = {name: [] for name in calls}
    for round_idx in range(rounds):
        count = repeats // rounds + (round_idx < repeats % rounds)
        for name, call in calls.items():
            if hasattr(call, "time_block"):
                seconds[name] += call.time_block(warmup, count)
            else:
                seconds[name] += time_calls(call, device, warmup, count)
        if each_round is not None:
            each_round()
    return {name: Timing(values) for name, values in seconds.items()}


class PeakTensorMemory(TorchDispatchMode):
    """
    Peak bytes of live tensor storages while active, counting `existing` tensors (weights, gradients,
    optimizer state) from the start: the CPU stand-in for `torch.accelerator.max_memory_allocated`, which
    only accelerators have. Sees eager ops only; code compiled by inductor allocates past it.
    """

    def __init__(self, existing: list[torch.Tensor] = ()):
        super().__init__()
        self.current_bytes = 0
        self.peak_bytes = 0
        self._live = {}  # id(storage) -> bytes, for storages alive now
        for tensor in existing:
            self._track(tensor)

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)  # torch keeps one Python object per storage while the storage lives
        if key in self._live:
            return
        self._live[key] = storage.nbytes()
        self.current_bytes += self._live[key]
        self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        weakref.finalize(storage, self._release, key).atexit = False

    def _release(self, key: int) -> None:
        self.current_bytes -= self._live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        output = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(output):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return output


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views and shared weights counted once)."""
    storages = {id(t.untyped_storage()): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def peak_memory_bytes(call: Callable[[], object], device: torch.device, existing: list[torch.Tensor]) -> int:
    """
    Peak memory of one `call`: the `existing` tensors it needs (weights, optimizer state) plus the most it
    allocates at once, from the allocator's statistics on accelerators and by counting live tensors on the CPU.
    Other models held in memory meanwhile are not counted.
    """
    if device.type == "cpu":
        with PeakTensorMemory(existing) as tracker:
            call()
        return tracker.peak_bytes
    synchronize(device)
    torch.accelerator.reset_peak_memory_stats(device)
    allocated_before = torch.accelerator.memory_allocated(device)
    call()
    synchronize(device)
    return torch.accelerator.max_memory_allocated(device) - allocated_before + storage_bytes(existing)


class PeakFlops:
    """
    The peak FLOP/s that MFU divides by (`resolve_peak_flops` for bf16 on accelerators, fp32 on CPUs, most of which
    have no fast bf16 matmul): given, the datasheet peak of a known GPU, or else the best rate of a square matmul
    measured so far in the run (`sample()` measures again; other processes only slow it down).
    """

    def __init__(self, device: torch.device, peak_tflops: float | None = None):
        self.device = device
        self.dtype = torch.bfloat16 if device.type != "cpu" else torch.float32
        self.value, self.source = resolve_peak_flops(device, self.dtype, peak_tflops)
        self.is_measured = self.source.startswith("measured")
        if self.is_measured:
            self.source = f"measured: best {str(self.dtype)[6:]} square-matmul rate of the run"
            for _ in range(INITIAL_PEAK_MEASUREMENTS - 1):
                self.sample()

    def sample(self) -> None:
        if self.is_measured:
            self.value = max(self.value, measure_peak_flops(self.device, self.dtype))


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info(device: torch.device) -> dict:
    """What the figures depend on: processor, accelerator, thread count, library versions, load at start."""
    info = {
        "cpu": _cpu_name(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": str(device),
        "accelerator": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
    }
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = round(os.getloadavg()[0], 2)
    return info


def is_under_load(info: dict) -> bool:
    """Other processes kept at least half the cores busy when the run started: timings are pessimistic."""
    return info.get("load_average_at_start", 0.0) >= 0.5 * (info["cpu_cores"] or 1)
