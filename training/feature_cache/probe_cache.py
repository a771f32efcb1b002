"""The probe phase's features: the frozen towers run once over the blocks and the probes train on what they kept
(`--probe_feature_cache memory` or `disk`), or the towers run again whenever a step reads a block (`none`, as the
reference code did); `auto` chooses by the cache's size (plan_feature_cache).

For every predicted position the cache keeps each tower's features and the target token: every position but a
block's last (causal LM), the masked positions (masked transformer towers) or every position (ELMo-style LSTM
towers, which never read the token they predict). A masked LM's blocks are masked once, with the masking collator's
epoch-0 masks (a function of the seed and the block), so the cache is static, like BERT's original static masking:
however many epochs the probes train, they see one masking of each block, where pretraining drew new masks every
epoch.

With --probe_backbone_dropout the training features are computed with the frozen model in train mode (dropout on,
one draw per block from the run's seed, static like the masks), as the reference's backbone ran during its probe
phase; the validation features never carry dropout. Padding (sentence-pair blocks) is never a target, so never cached.
Recomputed (`none`), a block keeps its epoch-0 masks but its dropout is drawn afresh at every read, as the reference's
was. Features are kept in the training precision (bf16 or fp16 under mixed precision, else float32) and read back
as float32, so every mode gives the probes the same numbers.

Each process holds its own contiguous share of the blocks (no block twice, so summed metrics are exact); which of
them each probe replica reads, in which order, is the probe phase's (phases/replica_sampling.py).
"""

import contextlib
import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import torch
from torch.utils.data import DataLoader

from ..data.blocks import collate_blocks
from .feature_cache_checks import (
    ShardWatch, ShardWriter, build_verified, cache_run_fingerprint, explicit_cache_note, manifest_file, map_shard,
    row_checksums,
)
from ..utils.atomic import free_bytes, readable_bytes
from ..utils.errors import TwoTowerUserError
from ..data.objectives import prediction_targets, target_shift

CACHE_DIR = "probe_feature_cache"  # under output_dir, with --probe_feature_cache disk; removed when the run ends
SPLITS = ("train", "validation")
MEMORY_SHARE = 0.5  # auto caches in memory when the cache takes at most this share of the free (device) memory
DISK_SHARE = 0.5  # the default --probe_cache_max_gb: this share of the output folder's free disk
FEATURE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}  # by accelerator.mixed_precision; else float32
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32"}
# numpy has no bfloat16: a disk cache holds its raw bits as int16, read back through a view
DISK_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.bfloat16: np.int16}
ACTIONS = {
    "memory": "caching them in memory",
    "disk": f"caching them on disk under OUTPUT_DIR/{CACHE_DIR}",
    "none": "recomputing the frozen towers every step",
}


def feature_dtype(accelerator) -> torch.dtype:
    """The precision features are kept in: the training precision (bf16 or fp16 under mixed precision), else float32."""
    return FEATURE_DTYPES.get(accelerator.mixed_precision, torch.float32)


def block_starts_of(counts: torch.LongTensor) -> torch.LongTensor:
    """[blocks] predicted positions per block -> [blocks + 1] first row of each block (and the end of the last)."""
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def gather_replica_rows(features: torch.Tensor, targets: torch.LongTensor, rows: torch.LongTensor, device,
                        already_read: bool = False) -> dict:
    """
    Rows `rows` [replicas, n] of features [positions, towers, hidden] and targets [positions], for the probes of every
    tower (tower-major, probe t * replicas + r): {"features": [probes, n, hidden] float32, "targets": [probes, n]}.
    `already_read`: `features` are the rows of `rows` already read, [replicas * n, towers, hidden] in that order.
    """
    num_replicas, n = rows.shape
    picked = features if already_read else features[rows.flatten().to(features.device)]
    picked = picked.to(device).float()  # [replicas * n, towers, hidden]
    num_towers = picked.shape[1]
    # [replicas * n, towers, hidden] -> [towers, replicas, n, hidden] -> [probes, n, hidden]
    picked = picked.view(num_replicas, n, num_towers, -1).permute(2, 0, 1, 3).flatten(0, 1)
    picked_targets = targets[rows.flatten().to(targets.device)].to(device).view(num_replicas, n)
    return {"features": picked, "targets": picked_targets.repeat(num_towers, 1)}


@dataclass
class FeatureCache:
    features: torch.Tensor  # [positions, towers, hidden] in the training precision: on the device, or a memmap (disk)
    targets: torch.LongTensor  # [positions], on the device
    num_blocks: int  # blocks the positions come from
    block_starts: torch.LongTensor | None = None  # [blocks + 1]: block b's positions are rows [starts[b], starts[b+1])
    shard: ShardWatch | None = None  # a disk cache's file, checked unchanged before every read

    def __len__(self) -> int:
        return self.targets.shape[0]

    def chunk(self, start: int, end: int) -> tuple[torch.Tensor, torch.LongTensor]:
        """Positions [start, end) for every probe: features [towers, n, hidden] float32, targets [n]; on the device."""
        rows = self.features[start:end]
        if self.shard is not None:  # a copy of the mapped rows: the rows checked are the rows trained on
            self.shard.check()
            rows = rows.clone()
            self.shard.check_rows(rows, slice(start, end))
        return rows.to(self.targets.device).float().transpose(0, 1), self.targets[start:end]

    def chunks(self, chunk_positions: int):
        """Every position, `chunk_positions` at a time: (features [towers, n, hidden], targets [n]) on the device."""
        for start in range(0, len(self), chunk_positions):
            yield self.chunk(start, start + chunk_positions)

    def replica_batch(self, positions: torch.LongTensor) -> dict:
        """
        Each replica's own positions, `positions` [replicas, n], for the probes of every tower (tower-major, probe
        t * replicas + r): {"features": [probes, n, hidden] float32, "targets": [probes, n]} on the device.
        """
        if self.shard is None:
            return gather_replica_rows(self.features, self.targets, positions, self.targets.device)
        self.shard.check()
        flat = positions.flatten().cpu()
        rows = self.features[flat]  # [replicas * n, towers, hidden], a copy: the rows checked are the rows trained on
        self.shard.check_rows(rows, flat)
        return gather_replica_rows(rows, self.targets, positions, self.targets.device, already_read=True)


@dataclass
class FrozenTowerFeatures:
    """
    `--probe_feature_cache none`: a FeatureCache's positions (rows numbered as a cache would hold them), their features
    recomputed by the frozen towers whenever they are read, `batch_size` blocks a forward. With `dropout_seed` the
    towers run in train mode, the dropout drawn from the seed and the rows read, so afresh at every step.
    """

    accelerator: object
    model: torch.nn.Module
    blocks: object  # this process's share of the blocks (datasets.Dataset)
    collator: object  # the cache's: a masked LM's seeded masks are a function of the block, the same at every read
    objective: str
    batch_size: int
    block_starts: torch.LongTensor  # [blocks + 1], from predicted_counts
    dtype: torch.dtype = torch.float32  # features are rounded to it, as a cache would keep them
    dropout_seed: int | None = None

    @property
    def num_blocks(self) -> int:
        return len(self.block_starts) - 1

    def __len__(self) -> int:
        return int(self.block_starts[-1])

    @torch.no_grad()
    def block_features(self, block_ids: torch.LongTensor) -> tuple[torch.Tensor, torch.LongTensor]:
        """The predicted positions of blocks `block_ids`, in turn: features [n, towers, hidden] and targets [n]."""
        kept_features, kept_targets = [], []
        blocks = self.blocks.with_format("torch")
        for start in range(0, len(block_ids), self.batch_size):
            columns = blocks[block_ids[start : start + self.batch_size].tolist()]
            examples = [dict(zip(columns, values)) for values in zip(*columns.values())]
            rows, targets, _ = batch_features(self.accelerator, self.model, self.collator(examples), self.objective,
                                              self.dtype)  # fmt: skip
            kept_features.append(rows)
            kept_targets.append(targets)
        features, targets = torch.cat(kept_features), torch.cat(kept_targets)
        expected = int((self.block_starts[block_ids + 1] - self.block_starts[block_ids]).sum())
        if len(targets) != expected:  # the collator must mask a block the same way at every read
            raise RuntimeError(f"Blocks recomputed to {len(targets)} predicted positions, counted {expected} before.")
        return features, targets

    def chunks(self, chunk_positions: int):
        """Every position, a forward of `batch_size` blocks at a time (`chunk_positions` is a cache's chunk size)."""
        for start in range(0, self.num_blocks, self.batch_size):
            features, targets = self.block_features(torch.arange(start, min(start + self.batch_size, self.num_blocks)))
            yield features.float().transpose(0, 1), targets

    def replica_batch(self, positions: torch.LongTensor) -> dict:
        """FeatureCache.replica_batch, the towers run over the union of the blocks that hold `positions`."""
        rows = positions.flatten().cpu()
        blocks = torch.searchsorted(self.block_starts, rows, right=True) - 1
        needed = blocks.unique()  # sorted: each block computed once, however many replicas read it
        dropout = contextlib.nullcontext()
        if self.dropout_seed is not None:
            key = np.array([self.dropout_seed], dtype=np.int64).tobytes() + rows.numpy().tobytes()
            seed = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") & (2**63 - 1)
            dropout = backbone_dropout(self.model, seed, self.accelerator.device)
        with dropout:
            features, targets = self.block_features(needed)
        counts = self.block_starts[needed + 1] - self.block_starts[needed]
        first_rows = counts.cumsum(0) - counts  # of each needed block, among the recomputed positions
        local = first_rows[torch.searchsorted(needed, blocks)] + rows - self.block_starts[blocks]
        return gather_replica_rows(features, targets, local.view(positions.shape), self.accelerator.device)


def process_share(accelerator, blocks):
    """This process's contiguous share of a datasets.Dataset of blocks; every process must get at least one."""
    if len(blocks) < accelerator.num_processes:
        raise ValueError(
            f"{len(blocks)} blocks cannot give each of {accelerator.num_processes} processes one; use fewer processes "
            f"or more data (--max_train_blocks, --max_eval_blocks)."
        )
    with accelerator.split_between_processes(list(range(len(blocks)))) as indices:
        return blocks.select(indices)


def batch_features(accelerator, model, batch: dict, objective: str, dtype: torch.dtype):
    """
    The frozen towers over a collated batch of blocks: (features [n, towers, hidden] in `dtype`, targets [n], predicted
    positions per block [batch]) of its predicted positions, block by block, on the device.
    """
    input_ids, labels = batch["input_ids"].to(accelerator.device), batch["labels"].to(accelerator.device)
    attention_mask = batch.get("attention_mask")  # sentence-pair blocks: 0 on the padding
    if attention_mask is not None:
        attention_mask = attention_mask.to(accelerator.device)
    with accelerator.autocast():
        features = model.probe_features(input_ids, attention_mask)  # [towers, batch, seq, hidden]
    rows, targets = model.scored_features(features, labels)  # [towers, n, hidden], [n]
    return rows.transpose(0, 1).to(dtype), targets, model.prediction_targets(labels).ne(-100).sum(-1)


@torch.no_grad()
def build_feature_cache(
    accelerator, model, blocks, collator, objective: str, batch_size: int, disk_file: Path | None = None,
    dtype: torch.dtype = torch.float32, run: str | None = None,
) -> FeatureCache:
    """
    Run the frozen towers of `model` over `blocks` (this process's share; `collator` masks them for a masked LM)
    and keep the features (in `dtype`) and target of every predicted position, in memory on the device or, given
    `disk_file`, in a file read back as a numpy memmap, recorded under the run's fingerprint `run` in the process's
    manifest beside it.
    """
    loader = DataLoader(blocks.with_format("torch"), batch_size=batch_size, collate_fn=collator)
    kept_features, kept_targets, kept_counts, kept_checksums = [], [], [], []
    disk = None
    if disk_file is not None:  # hashed as written
        disk = ShardWriter(disk_file, manifest_file(disk_file.parent, accelerator.process_index), run)
    for batch in loader:
        rows, targets, counts = batch_features(accelerator, model, batch, objective, dtype)
        if disk is not None:  # [n, towers, hidden], appended in order; bf16 as its raw bits
            disk.write(rows.cpu().view(torch.int16 if dtype == torch.bfloat16 else dtype).numpy().tobytes())
            kept_checksums.append(row_checksums(rows).cpu())
        else:
            kept_features.append(rows)
        kept_targets.append(targets)
        kept_counts.append(counts.cpu())
    targets = torch.cat(kept_targets)
    if disk is None:
        features, shard = torch.cat(kept_features), None
    else:
        disk.close()
        shape = (len(targets), *rows.shape[1:])
        # verified against what this run wrote
        array, shard = map_shard(disk, DISK_DTYPES[dtype], shape, torch.cat(kept_checksums))
        features = torch.from_numpy(array)
        if dtype == torch.bfloat16:
            features = features.view(torch.bfloat16)
    return FeatureCache(features, targets, len(blocks), block_starts_of(torch.cat(kept_counts)), shard)


def predicted_counts(blocks, collator, objective: str, batch_size: int = 1024) -> torch.LongTensor:
    """
    Predicted positions of each block, [blocks], before any tower runs: block_size - shift for unpadded blocks that
    are not masked; else counted from the collated blocks (a masked LM's seeded masks are the ones the towers get).
    """
    if collator is collate_blocks and "attention_mask" not in blocks.column_names:
        return torch.full((len(blocks),), len(blocks[0]["input_ids"]) - target_shift(objective))
    loader = DataLoader(blocks.with_format("torch"), batch_size=batch_size, collate_fn=collator)
    return torch.cat([prediction_targets(batch["labels"], objective).ne(-100).sum(-1) for batch in loader])


def process_counts(accelerator, count: int) -> list[int]:
    """`count` as every process has it (e.g. its number of cached positions), in process order."""
    return accelerator.gather(torch.tensor([count], device=accelerator.device)).tolist()


@contextlib.contextmanager
def backbone_dropout(model, seed: int, device: torch.device):
    """The frozen model in train mode, its dropout drawn from `seed`; then each module's mode and the RNG as before."""
    modes = [(module, module.training) for module in model.modules()]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model.train()
        try:
            yield
        finally:
            for module, training in modes:
                module.training = training


@dataclass
class FeatureCachePlan:
    choice: str  # memory | disk | none: where the probes' features come from
    cache_bytes: int  # the features of every process's cache together (a memory cache adds 8 bytes of target each)
    message: str  # what was chosen and why, with the size: printed before the towers run


def plan_feature_cache(
    requested: str, probe_type: str, num_towers: int, hidden_size: int, dtype: torch.dtype, train_positions: int,
    validation_positions: int, free_memory_bytes: int, free_disk_bytes: int, probe_cache_max_gb: float | None = None,
) -> FeatureCachePlan:
    """
    Where the probe phase's features come from, for --probe_feature_cache `requested`. `auto` caches in memory when
    the cache fits in MEMORY_SHARE of `free_memory_bytes` (of every device together, or of the CPU's memory), else on
    disk when it fits in --probe_cache_max_gb (None: DISK_SHARE of `free_disk_bytes`, the output folder's), else
    recomputes the frozen towers every step; linear probes (full-batch L-BFGS) need a cache, and are refused instead.
    """
    cache_bytes = (train_positions + validation_positions) * num_towers * hidden_size * dtype.itemsize
    size = (f"Probe features: {num_towers} x {hidden_size} {DTYPE_NAMES[dtype]} per position, {train_positions:,} "
            f"training + {validation_positions:,} validation positions = {readable_bytes(cache_bytes)}")  # fmt: skip
    if requested != "auto":
        note = explicit_cache_note(requested, cache_bytes, size, free_memory_bytes, free_disk_bytes, probe_cache_max_gb)
        return FeatureCachePlan(requested, cache_bytes, f"{size}: {ACTIONS[requested]} (--probe_feature_cache "
                                                        f"{requested}){note}")  # fmt: skip
    memory_budget = MEMORY_SHARE * free_memory_bytes
    memory = f"{readable_bytes(memory_budget)}, half the free memory"
    if probe_cache_max_gb is None:
        disk_budget = DISK_SHARE * free_disk_bytes
        disk = f"{readable_bytes(disk_budget)}, half the output folder's free disk"
    else:
        disk_budget, disk = probe_cache_max_gb * 1e9, f"--probe_cache_max_gb {float(probe_cache_max_gb)}"
    if cache_bytes <= memory_budget:
        choice, reason = "memory", f"<= {memory}"
    elif cache_bytes <= disk_budget:
        choice, reason = "disk", f"> {memory}; <= {disk}"
    elif probe_type == "linear":
        raise TwoTowerUserError(
            f"{size} > {disk} and > {memory}: --probe_type linear needs a cache (full-batch L-BFGS reads every "
            f"position at every iteration); raise --probe_cache_max_gb or train on fewer blocks (--max_train_blocks)."
        )
    else:
        choice, reason = "none", f"> {disk} and > {memory}"
    return FeatureCachePlan(choice, cache_bytes, f"{size} {reason}: {ACTIONS[choice]} (probe_feature_cache {choice})")


def free_memory_bytes(accelerator) -> int:
    """Where a memory cache would live: the free memory of every device together (GPU), or the machine's (CPU)."""
    if accelerator.device.type == "cuda":
        free = torch.cuda.mem_get_info(accelerator.device)[0]
        return min(process_counts(accelerator, free)) * accelerator.num_processes
    return min(process_counts(accelerator, psutil.virtual_memory().available))  # shared by the processes


def free_disk_bytes(accelerator, output_dir: str) -> int:
    """The free disk of the output folder (or of its nearest existing parent), the least any process sees."""
    return min(process_counts(accelerator, free_bytes(Path(output_dir).resolve())))


def cache_both_splits(accelerator, model, lm_datasets, collators, objective: str, config) -> dict:
    """
    {"train", "validation"} features of this process's share of each split: a FeatureCache (memory, disk) or
    FrozenTowerFeatures (none), as plan_feature_cache chooses; prints the choice before the towers run, and a cache's
    cost after.
    """
    dtype = feature_dtype(accelerator)
    shares = {split: process_share(accelerator, lm_datasets[split]) for split in SPLITS}
    counts = {split: predicted_counts(shares[split], collator, objective)
              for split, collator in zip(SPLITS, collators)}  # fmt: skip
    plan = plan_feature_cache(
        config.probe_feature_cache, config.probe_type, model.config.num_towers, model.config.hidden_size, dtype,
        *(sum(process_counts(accelerator, int(counts[split].sum()))) for split in SPLITS),
        free_memory_bytes(accelerator), free_disk_bytes(accelerator, config.output_dir),
        getattr(config, "probe_cache_max_gb", None),
    )
    accelerator.print(plan.message)
    if plan.choice == "none":
        return {split: FrozenTowerFeatures(
            accelerator, model, shares[split], collator, objective, config.per_device_eval_batch_size,
            block_starts_of(counts[split]), dtype,
            config.seed if config.probe_backbone_dropout and split == "train" else None,
        ) for split, collator in zip(SPLITS, collators)}  # fmt: skip
    start = time.perf_counter()
    folder = Path(config.output_dir) / CACHE_DIR if plan.choice == "disk" else None
    run = None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        run = cache_run_fingerprint(config, accelerator.process_index, accelerator.num_processes, dtype)
    caches = {}
    for split, collator in zip(SPLITS, collators):
        disk_file = None if folder is None else folder / f"{split}_process{accelerator.process_index}.bin"
        with_dropout = config.probe_backbone_dropout and split == "train"

        def build(split=split, collator=collator, disk_file=disk_file, with_dropout=with_dropout):
            with backbone_dropout(model, config.seed, accelerator.device) if with_dropout else contextlib.nullcontext():
                return build_feature_cache(accelerator, model, shares[split], collator, objective,
                                           config.per_device_eval_batch_size, disk_file, dtype, run)  # fmt: skip

        caches[split] = build_verified(build, split)  # a shard that does not verify is built again
    positions = {split: sum(process_counts(accelerator, len(cache))) for split, cache in caches.items()}
    accelerator.print(
        f"Cached the frozen towers' features of {positions['train']} training and {positions['validation']} "
        f"validation positions ({plan.choice}) in {time.perf_counter() - start:.1f} s"
    )
    return caches
