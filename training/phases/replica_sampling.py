"""
The probe phase's sampling of the cached positions: which blocks each probe replica reads and in which order. Probe
steps read, for each replica, the predicted positions of its blocks (all of this process's, or its own slice) in an
order of the blocks drawn from (seed, epoch, replica), positions_per_step at a time: a block-based order that
recomputing the frozen towers (`--probe_feature_cache none`) can follow as well as a cache.
"""

import math

import numpy as np
import torch

from ..feature_cache.probe_cache import process_counts
from ..utils.errors import TwoTowerUserError


def batch_positions(accelerator, cache, config) -> int:
    """
    Positions per probe step and process: as given, or those of a step of blocks (per_device x accumulation) on
    average; `cache` a FeatureCache or FrozenTowerFeatures.
    """
    if config.probe_batch_positions is not None:
        return config.probe_batch_positions
    blocks_per_step = config.per_device_train_batch_size * config.gradient_accumulation_steps
    positions, blocks = sum(process_counts(accelerator, len(cache))), sum(process_counts(accelerator, cache.num_blocks))
    return math.ceil(blocks_per_step * positions / blocks)


def replica_orders(seed: int, epoch: int, num_replicas: int, num_blocks: int, disjoint: bool = False) -> torch.LongTensor:
    """
    Each replica's order of the blocks (of this process's share) in `epoch`, [replicas, blocks]: replica r's is a
    permutation drawn from (seed, epoch, r), so it differs between replicas and epochs and is shared by every tower's
    replica r. Disjoint: replica r orders only its slice, the r-th of `num_replicas` equal contiguous runs of the
    blocks ([replicas, num_blocks // num_replicas]; the last num_blocks % num_replicas blocks are read by none).
    """
    if not disjoint:
        rows = [np.random.default_rng((seed, epoch, replica)).permutation(num_blocks) for replica in range(num_replicas)]
        return torch.from_numpy(np.stack(rows))
    slice_blocks = num_blocks // num_replicas
    if slice_blocks == 0:
        raise TwoTowerUserError(
            f"--probe_replica_data disjoint cuts {num_blocks} training blocks (of this process) into "
            f"{num_replicas} slices, one a replica; give each at least one: raise --max_train_blocks or use fewer "
            "--probe_replicas."
        )
    rows = [replica * slice_blocks + np.random.default_rng((seed, epoch, replica)).permutation(slice_blocks)
            for replica in range(num_replicas)]
    return torch.from_numpy(np.stack(rows))


def stream_lengths(orders: torch.LongTensor, block_starts: torch.LongTensor) -> torch.LongTensor:
    """Each replica's positions in an epoch, [replicas]: those of the blocks it orders."""
    counts = block_starts[1:] - block_starts[:-1]  # [blocks]
    return counts[orders].sum(dim=1)


def _stream_slice(order: torch.LongTensor, block_starts: torch.LongTensor, start: int, end: int) -> torch.LongTensor:
    """Rows [start, end) of the stream of every block's rows, the blocks in `order`."""
    counts = (block_starts[1:] - block_starts[:-1])[order]  # [blocks], in order
    ends = counts.cumsum(0)  # where each block's rows end in the stream
    first, last = (int(torch.searchsorted(ends, row, right=True)) for row in (start, end - 1))
    blocks, lengths = order[first : last + 1], counts[first : last + 1]
    # each block's rows in turn: block_starts[b], block_starts[b] + 1, ...
    rows = torch.repeat_interleave(block_starts[blocks] - (lengths.cumsum(0) - lengths), lengths)
    rows += torch.arange(len(rows))
    skip = start - (int(ends[first - 1]) if first > 0 else 0)
    return rows[skip : skip + end - start]


def step_positions(
    orders: torch.LongTensor, step: int, steps_per_epoch: int, positions_per_step: int,
    block_starts: torch.LongTensor | None = None,
) -> torch.LongTensor:
    """
    Each replica's rows for `step` of an epoch, [replicas, n]: the next `positions_per_step` of its stream, the
    predicted positions of its blocks in its order of them (`orders` [replicas, blocks], `block_starts` [blocks + 1];
    without them every position is a block of its own). The epoch's last step takes all that is left of the
    shortest stream, so that every replica takes as many positions (replicas ordering the same blocks have streams
    of one length; disjoint slices may differ by a few masked positions).
    """
    if block_starts is None:
        block_starts = torch.arange(int(orders.max()) + 2)
    start = step * positions_per_step
    last = step == steps_per_epoch - 1
    end = int(stream_lengths(orders, block_starts).min()) if last else start + positions_per_step
    return torch.stack([_stream_slice(order, block_starts, start, end) for order in orders])
