"""The timed workloads (a training step, cached greedy decoding, scoring) and the settings they run under."""

import contextlib
import inspect
import shutil
from dataclasses import dataclass

import torch
from accelerate.utils import compile_regions
from torch import nn

from twotower.training.launch.compilation import draw_random_eagerly_on_cpu

from .baselines import gold_logprobs
from .measure import peak_memory_bytes, time_interleaved

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
ATTN_IMPLEMENTATIONS = ("sdpa", "eager")
COMPILE_MODES = ("none", "full", "regional")
AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MAX_GRAD_NORM = 1.0  # the paper's clipping: part of every real training step


@dataclass(frozen=True)
class Setting:
    precision: str = "fp32"  # fp32 | tf32 (fp32 weights, TF32 matmuls; NVIDIA only) | bf16 | fp16 (autocast)
    attn_implementation: str = "sdpa"  # sdpa (torch's fused kernels) | eager (plain matmuls and softmax)
    compile: str = "none"  # none | full (torch.compile of the model) | regional (Accelerate's compile_regions)
    activation_checkpointing: bool = False  # recompute each layer's activations in backward: less memory

    def __post_init__(self):
        for name, allowed in (
            ("precision", PRECISIONS),
            ("attn_implementation", ATTN_IMPLEMENTATIONS),
            ("compile", COMPILE_MODES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"`{name}` is {getattr(self, name)!r}; choose one of {list(allowed)}.")

    def __str__(self) -> str:
        parts = [self.precision, self.attn_implementation]
        if self.compile != "none":
            parts.append(f"compile={self.compile}")
        if self.activation_checkpointing:
            parts.append("act-ckpt")
        return ", ".join(parts)


def why_unsupported(setting: Setting, device: torch.device) -> str | None:
    """Why `setting` cannot run on `device`, or None when it can."""
    if setting.precision == "tf32" and device.type != "cuda":
        return "TF32 matmuls exist only on NVIDIA GPUs"
    if setting.precision == "fp16" and device.type == "cpu":
        return "Accelerate allows fp16 mixed precision only on accelerators"
    if setting.precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16"
    if setting.compile != "none" and device.type == "cpu" and shutil.which("g++") is None:
        return "torch.compile on the CPU needs a C++ compiler (g++ not found)"
    return None


@contextlib.contextmanager
def precision_context(setting: Setting, device: torch.device):
    """Autocast for bf16/fp16 (what Accelerate's mixed_precision does) and TF32 matmuls for tf32."""
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if setting.precision == "tf32" else "highest")
    dtype = AUTOCAST_DTYPES.get(setting.precision)
    try:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            yield
    finally:
        torch.set_float32_matmul_precision(previous)


def random_ids(vocab_size: int, batch: int, seq_len: int, device: torch.device, seed: int = 0) -> torch.LongTensor:
    """Dummy tokens, [batch, seq_len]: speed does not depend on which tokens the model reads."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, seq_len), generator=generator).to(device)


def prepare_for_training(model: nn.Module, setting: Setting, device: torch.device) -> nn.Module:
    """Move, switch attention and checkpointing, then compile: returns what the training step calls."""
    model.to(device).train()
    model.set_attn_implementation(setting.attn_implementation)
    if setting.activation_checkpointing:
        model.activation_checkpointing_enable()
    if setting.compile != "none":  # as the training command compiles
        draw_random_eagerly_on_cpu(device)
    if setting.compile == "full":
        return torch.compile(model)
    if setting.compile == "regional":
        return compile_regions(model)
    return model


@dataclass
class Measurement:
    tokens_per_s: float  # trained, generated or scored tokens per second, at the median call
    call_s: float  # median seconds of one call: a training step, one generate(), one scoring batch
    peak_memory_bytes: int | None  # None where it cannot be measured (compiled code on the CPU)


def training_loss_kwargs(model: nn.Module) -> dict:
    """What a model's training loop passes beside the labels: the two-tower training command asks for the loss
    alone (`skip_logits`), the other models have no such option."""
    return {"skip_logits": True} if "skip_logits" in inspect.signature(model.forward).parameters else {}


class _Workload:
    """A timed call that knows the tensors it needs (`live_tensors`) and the device it runs on."""

    def peak_memory(self) -> int:
        """Peak bytes of one more call (`peak_memory_bytes`)."""
        return peak_memory_bytes(self, self.device, self.live_tensors())


class TrainingStep(_Workload):
    """One optimizer step on a fixed micro-batch: forward, backward, clipping, AdamW, as a training loop does."""

    def __init__(self, model: nn.Module, setting: Setting, device: torch.device, input_ids: torch.LongTensor):
        self.model = model
        self.callable_model = prepare_for_training(model, setting, device)
        self.setting = setting
        self.device = device
        self.input_ids = input_ids
        self.tokens = input_ids.numel()
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        self.scaler = torch.amp.GradScaler(device.type, enabled=setting.precision == "fp16")
        self.loss_kwargs = training_loss_kwargs(model)

    def __call__(self) -> None:
        with precision_context(self.setting, self.device):
            loss = self.callable_model(input_ids=self.input_ids, labels=self.input_ids, **self.loss_kwargs).loss
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    @property
    def measures_memory(self) -> bool:
        return self.setting.compile == "none" or self.device.type != "cpu"

    def live_tensors(self) -> list[torch.Tensor]:
        """Weights, gradients and optimizer state: what exists before a step starts."""
        tensors = [*self.model.parameters(), *self.model.buffers(), self.input_ids]
        tensors += [value for state in self.optimizer.state.values() for value in state.values()]
        return [t for t in tensors if isinstance(t, torch.Tensor)]


class _InferenceCall(_Workload):
    """A no-grad call of an eval-mode model under `setting` (decoding and scoring run uncompiled)."""

    measures_memory = True

    def __init__(self, model: nn.Module, setting: Setting, input_ids: torch.LongTensor):
        self.model = model.to(input_ids.device).eval()
        self.model.set_attn_implementation(setting.attn_implementation)
        self.setting = setting
        self.device = input_ids.device
        self.input_ids = input_ids

    def __call__(self) -> None:
        with torch.no_grad(), precision_context(self.setting, self.device):
            self.run()

    def live_tensors(self) -> list[torch.Tensor]:
        return [*self.model.parameters(), *self.model.buffers(), self.input_ids]


class Decoding(_InferenceCall):
    """Greedy `generate` with the KV cache: `new_tokens` per sequence after the prompt (its prefill included)."""

    def __init__(self, model: nn.Module, setting: Setting, prompt_ids: torch.LongTensor, new_tokens: int):
        super().__init__(model, setting, prompt_ids)
        self.new_tokens = new_tokens
        self.tokens = prompt_ids.shape[0] * new_tokens

    def run(self) -> None:
        self.model.generate(
            self.input_ids,
            attention_mask=torch.ones_like(self.input_ids),
            max_new_tokens=self.new_tokens,
            do_sample=False,
            use_cache=True,
            pad_token_id=0,
        )


class Scoring(_InferenceCall):
    """The scoring pipeline: gold log-probabilities of every next token of a batch."""

    def __init__(self, model: nn.Module, setting: Setting, input_ids: torch.LongTensor):
        super().__init__(model, setting, input_ids)
        self.tokens = input_ids.shape[0] * (input_ids.shape[1] - 1)

    def run(self) -> None:
        gold_logprobs(self.model, self.input_ids)


def measure(
    workloads: dict, device: torch.device, warmup: int, repeats: int, rounds: int = 1, each_round=None
) -> dict:
    """
    Time the workloads (TrainingStep, Decoding, Scoring) in rounds of blocks (see `time_interleaved`), then run
    each once more for its peak memory. Returns {name: Measurement}.
    """
    timings = time_interleaved(workloads, device, warmup, repeats, rounds, each_round)
    measurements = {}
    for name, workload in workloads.items():
        memory = workload.peak_memory() if workload.measures_memory else None
        median_s = timings[name].median_s
        measurements[name] = Measurement(workload.tokens / median_s, median_s, memory)
    return measurements
