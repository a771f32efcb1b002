"""The probe phase's feature cache: the frozen towers run once over the blocks, and the probes train on what they kept.

For every predicted position the cache keeps each tower's features and the target token: every position but a
block's last (causal LM), the masked positions (masked transformer towers) or every position (ELMo-style LSTM
towers, which never read the token they predict). A masked LM's blocks are masked once, with the masking collator's
epoch-0 masks (a function of the seed and the block), so the cache is static, like BERT's original static masking:
however many epochs the probes train, they see one masking of each block, where pretraining drew new masks every
epoch.

With --probe_backbone_dropout the training features are computed with the frozen model in train mode (dropout on,
one draw per block from the run's seed, static like the masks), as the reference's backbone ran during its probe
phase; the validation features never carry dropout. Padding (sentence-pair blocks) is never a target, so never cached.

Each process caches its own contiguous share of the blocks (no block twice, so summed metrics are exact). Probe
steps then read the positions of each replica in an order drawn from (seed, epoch, replica).
"""

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from .objectives import predicting_positions, prediction_targets

CACHE_DIR = "probe_feature_cache"  # under output_dir, with --probe_feature_cache disk; removed when the run ends


@dataclass
class FeatureCache:
    features: torch.Tensor  # [positions, towers, hidden] float32: on the device, or on a numpy memmap (disk)
    targets: torch.LongTensor  # [positions], on the device
    num_blocks: int  # blocks the positions come from

    def __len__(self) -> int:
        return self.targets.shape[0]

    def chunk(self, start: int, end: int) -> tuple[torch.Tensor, torch.LongTensor]:
        """Positions [start, end) for every probe: features [towers, n, hidden] and targets [n], on the device."""
        features = self.features[start:end].to(self.targets.device).transpose(0, 1)
        return features, self.targets[start:end]

    def replica_batch(self, positions: torch.LongTensor) -> dict:
        """
        Each replica's own positions, `positions` [replicas, n], for the probes of every tower (tower-major, probe
        t * replicas + r): {"features": [probes, n, hidden], "targets": [probes, n]} on the device.
        """
        num_replicas, n = positions.shape
        rows = self.features[positions.flatten().to(self.features.device)].to(self.targets.device)
        num_towers = rows.shape[1]
        # [replicas * n, towers, hidden] -> [towers, replicas, n, hidden] -> [probes, n, hidden]
        features = rows.view(num_replicas, n, num_towers, -1).permute(2, 0, 1, 3).flatten(0, 1)
        targets = self.targets[positions.flatten().to(self.targets.device)].view(num_replicas, n).repeat(num_towers, 1)
        return {"features": features, "targets": targets}


def process_share(accelerator, blocks):
    """This process's contiguous share of a datasets.Dataset of blocks; every process must get at least one."""
    if len(blocks) < accelerator.num_processes:
        raise ValueError(
            f"{len(blocks)} blocks cannot give each of {accelerator.num_processes} processes one; use fewer processes "
            f"or more data (--max_train_blocks, --max_eval_blocks)."
        )
    with accelerator.split_between_processes(list(range(len(blocks)))) as indices:
        return blocks.select(indices)


@torch.no_grad()
def build_feature_cache(
    accelerator, model, blocks, collator, objective: str, batch_size: int, disk_file: Path | None = None
) -> FeatureCache:
    """
    Run the frozen towers of `model` over `blocks` (this process's share; `collator` masks them for a masked LM)
    and keep the features and target of every predicted position, in memory on the device or, given `disk_file`,
    in a float32 file read back as a memmap.
    """
    loader = DataLoader(blocks.with_format("torch"), batch_size=batch_size, collate_fn=collator)
    kept_features, kept_targets = [], []
    disk = open(disk_file, "wb") if disk_file is not None else None
    for batch in loader:
        input_ids, labels = batch["input_ids"].to(accelerator.device), batch["labels"].to(accelerator.device)
        attention_mask = batch.get("attention_mask")  # sentence-pair blocks: 0 on the padding
        if attention_mask is not None:
            attention_mask = attention_mask.to(accelerator.device)
        with accelerator.autocast():
            features = model.probe_features(input_ids, attention_mask)  # [towers, batch, seq, hidden]
        targets = prediction_targets(labels, objective)  # [batch, seq - shift]
        predicted = targets != -100
        rows = predicting_positions(features, objective, seq_dim=2)[:, predicted].transpose(0, 1).float()
        if disk is not None:
            disk.write(rows.cpu().numpy().tobytes())  # [n, towers, hidden], appended in order
        else:
            kept_features.append(rows)
        kept_targets.append(targets[predicted])
    targets = torch.cat(kept_targets)
    if disk is None:
        features = torch.cat(kept_features)
    else:
        disk.close()
        shape = (len(targets), *rows.shape[1:])
        features = torch.from_numpy(np.memmap(disk_file, dtype=np.float32, mode="r+", shape=shape))
    return FeatureCache(features, targets, len(blocks))


def process_counts(accelerator, count: int) -> list[int]:
    """`count` as every process has it (e.g. its number of cached positions), in process order."""
    return accelerator.gather(torch.tensor([count], device=accelerator.device)).tolist()


@contextlib.contextmanager
def backbone_dropout(model, seed: int, device: torch.device):
    """The frozen model in train mode, its dropout drawn from `seed`; then eval mode again, and the RNG as before."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        model.train()
        try:
            yield
        finally:
            model.eval()


def cache_both_splits(accelerator, model, lm_datasets, collators, objective: str, config) -> dict[str, FeatureCache]:
    """{"train", "validation"} caches of this process's share of each split; prints what it cost."""
    start = time.perf_counter()
    folder = Path(config.output_dir) / CACHE_DIR if config.probe_feature_cache == "disk" else None
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
    caches = {}
    for split, collator in zip(("train", "validation"), collators):
        disk_file = None if folder is None else folder / f"{split}_process{accelerator.process_index}.bin"
        blocks = process_share(accelerator, lm_datasets[split])
        with_dropout = config.probe_backbone_dropout and split == "train"
        with backbone_dropout(model, config.seed, accelerator.device) if with_dropout else contextlib.nullcontext():
            caches[split] = build_feature_cache(
                accelerator, model, blocks, collator, objective, config.per_device_eval_batch_size, disk_file
            )
    positions = {split: sum(process_counts(accelerator, len(cache))) for split, cache in caches.items()}
    accelerator.print(
        f"Cached the frozen towers' features of {positions['train']} training and {positions['validation']} "
        f"validation positions ({config.probe_feature_cache}) in {time.perf_counter() - start:.1f} s"
    )
    return caches


def batch_positions(accelerator, cache: FeatureCache, config) -> int:
    """Positions per probe step and process: as given, or those of a step of blocks (per_device x accumulation)."""
    if config.probe_batch_positions is not None:
        return config.probe_batch_positions
    blocks_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    positions, blocks = sum(process_counts(accelerator, len(cache))), sum(process_counts(accelerator, cache.num_blocks))
    return math.ceil(blocks_per_step * positions / blocks)


def replica_orders(seed: int, epoch: int, num_replicas: int, num_positions: int) -> torch.LongTensor:
    """
    Each replica's order of the cached positions in `epoch`, [replicas, positions]: replica r's is a permutation
    drawn from (seed, epoch, r), so it differs between replicas and epochs and is shared by every tower's replica r.
    """
    rows = [np.random.default_rng((seed, epoch, replica)).permutation(num_positions) for replica in range(num_replicas)]
    return torch.from_numpy(np.stack(rows))


def step_positions(orders: torch.LongTensor, step: int, steps_per_epoch: int, positions_per_step: int):
    """Each replica's positions for `step` of an epoch, [replicas, n]; the epoch's last step takes all that is left."""
    start = step * positions_per_step
    end = None if step == steps_per_epoch - 1 else start + positions_per_step
    return orders[:, start:end]
