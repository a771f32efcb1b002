"""
Checks of the probe phase's feature cache: the budget of an explicit `--probe_feature_cache`, and the integrity of a
disk cache's shards (one file per split and process).

A cache knows whose it is. Each process's manifest (MANIFEST_PROCESS_N.json beside its shards) names the run that
built them, by a fingerprint of the frozen model's weights, the data and every option that decides the blocks, their
order, masks and dropout, and holds each shard's sha256 and size as the run wrote it. A shard is checked when it is
mapped against what this run wrote (kept in memory, not read back from the folder): a shard of another run, with a
manifest that verifies it, or a damaged shard is built again, never trained on.

While the run reads a mapped shard, every read first compares the file's size, modification time and inode with
those it was mapped with, then the rows it read with a checksum of each row taken as they were written: a shard
truncated, rewritten or replaced under the run (even with its time set back) stops it with one error instead of
training on other bytes. The size is checked before anything is mapped (numpy would extend a short file with zeros);
a truncation in the instant between that check and a read still ends the process with SIGBUS, which no Python code
can catch.
"""

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from modeling_twotower.checkpoint_checks import loaded_weight_files

from ..checkpoints.checkpointing import data_fingerprint
from ..checkpoints.manifest import files_fingerprint
from ..utils.atomic import readable_bytes, write_text_atomically
from ..utils.errors import TwoTowerUserError

READ_CHUNK = 1 << 20
# the weights of a row's checksum: fixed, so that a row's checksum is the same in every run (see row_checksums)
ROW_CHECKSUM_SEED = 20240611
ROW_CHECKSUM_WEIGHT_LIMIT = 1 << 16  # weights below it keep every row's weighted sum of raw bits inside int64
# the integer type whose bits each feature dtype's values are read as, for the row checksums
RAW_BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def explicit_cache_note(requested: str, cache_bytes: int, size: str, free_memory: int, free_disk: int,
                        max_gb: float | None) -> str:
    """
    An explicit --probe_feature_cache against its budget: a disk cache over --probe_cache_max_gb (or the output
    folder's free disk) or a memory cache over the free memory is refused; otherwise what the budget said, for the
    plan's message ("" when there is nothing to say).
    """
    fixes = ("train on fewer blocks (--max_train_blocks), or pass --probe_feature_cache auto (which chooses by the "
             "budgets) or none (recompute the frozen towers every step)")
    if requested == "disk":
        budget, named = ((max_gb * 1e9, f"--probe_cache_max_gb {float(max_gb)}") if max_gb is not None else
                         (free_disk, f"{readable_bytes(free_disk)}, the output folder's free disk"))  # fmt: skip
        if cache_bytes > budget:
            raise TwoTowerUserError(f"{size} > {named}: --probe_feature_cache disk does not fit its budget; raise "
                                    f"--probe_cache_max_gb or free disk, {fixes}.")  # fmt: skip
        return f" (<= {named})"
    if requested == "memory" and cache_bytes > free_memory:
        raise TwoTowerUserError(f"{size} > {readable_bytes(free_memory)}, the free memory: --probe_feature_cache memory "
                                f"does not fit; pass --probe_feature_cache disk, {fixes}.")  # fmt: skip
    if max_gb is not None:  # memory or none: the disk budget bounds nothing here
        return f" (--probe_cache_max_gb bounds a disk cache only: not applied to --probe_feature_cache {requested})"
    return ""


class ShardChanged(TwoTowerUserError):
    """A shard of the disk cache that is not what was written: damaged before mapping, or changed under the run."""


def cache_run_fingerprint(config, process_index: int, num_processes: int, dtype: torch.dtype) -> str:
    """
    Whose a cache is: the sha256 of the frozen model's weight files (each file's sha256, read once per run), the
    data's fingerprint (checkpointing.data_fingerprint), every option of the run (the blocks, their order, the
    masks and dropout follow from them), the process and the feature dtype.
    """
    weights = files_fingerprint([str(path) for path in loaded_weight_files(config.pretrained_model)])
    identity = {"weights": weights, "data": data_fingerprint(config), "options": dataclasses.asdict(config),
                "process": [process_index, num_processes], "dtype": str(dtype)}  # fmt: skip
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()


def manifest_file(folder: Path, process_index: int) -> Path:
    return Path(folder) / f"manifest_process{process_index}.json"


def row_checksums(rows: torch.Tensor) -> torch.LongTensor:
    """
    [n] a checksum of each row of rows [n, towers, hidden] (feature dtype, any device), from its raw bits: a weighted
    sum with fixed weights, exact in int64. It tells this run's rows from another's or from damaged ones (any
    change of one value changes it); it is no defence against rows crafted to collide, which the sha256 at mapping is.
    """
    bits = rows.reshape(rows.shape[0], -1).view(RAW_BITS[rows.dtype]).long()  # [n, towers * hidden]
    generator = torch.Generator().manual_seed(ROW_CHECKSUM_SEED)
    weights = torch.randint(1, ROW_CHECKSUM_WEIGHT_LIMIT, (bits.shape[1],), generator=generator)
    return (bits * weights.to(bits.device)).sum(dim=1)


class ShardWriter:
    """
    A shard's file, hashed as it is written; closing it records its sha256 and size under this run's fingerprint
    (`run`) in the process's manifest, and keeps that record (`record`) to check the shard against when it is mapped.
    """

    def __init__(self, path: Path, manifest: Path, run: str):
        self.path, self.manifest, self.run = Path(path), Path(manifest), run
        self.file, self.hash, self.bytes, self.record = open(path, "wb"), hashlib.sha256(), 0, None

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.hash.update(data)
        self.bytes += len(data)

    def close(self) -> None:
        self.file.close()
        self.record = {"sha256": self.hash.hexdigest(), "bytes": self.bytes}
        try:
            written = json.loads(self.manifest.read_text())
        except (OSError, ValueError):
            written = {}
        shards = written.get("shards", {}) if written.get("run") == self.run else {}  # another run's: replaced
        manifest = {"run": self.run, "shards": {**shards, self.path.name: self.record}}
        write_text_atomically(self.manifest, json.dumps(manifest, indent=1) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def shard_problem(writer: ShardWriter, expected_bytes: int) -> str | None:
    """
    Why a shard is not what this run wrote (`writer`): its manifest names another run, or another checksum, or its
    size or bytes differ from those written; None when it verifies.
    """
    path, manifest = writer.path, writer.manifest
    try:
        written = json.loads(manifest.read_text())
        size = path.stat().st_size
    except (OSError, ValueError) as error:
        return f"it or its manifest cannot be read ({error})"
    if not isinstance(written, dict) or written.get("run") != writer.run:
        named = written.get("run") if isinstance(written, dict) else None
        return (f"it is another run's cache: {manifest.name} names the run {str(named)[:12]}, this run is "
                f"{writer.run[:12]} (other weights, data or options)")  # fmt: skip
    if (written.get("shards") or {}).get(path.name) != writer.record:
        return f"its record in {manifest.name} is not the sha256 and size this run wrote"
    if size != expected_bytes or writer.record["bytes"] != expected_bytes:
        return f"it holds {size:,} bytes, its rows take {expected_bytes:,} (written: {writer.record['bytes']:,})"
    if _sha256(path) != writer.record["sha256"]:
        return "its bytes do not match the sha256 written when it was built"
    return None


@dataclass
class ShardWatch:
    """
    What a mapped shard was when mapped, and the checksum of each row as written; `check` before every read stops
    the run if the file changed since, `check_rows` after it if the rows read are not those written.
    """

    path: Path
    stat: tuple[int, int, int]  # size, modification time (ns), inode
    row_checksums: torch.LongTensor  # [rows], row_checksums of the rows as the run wrote them

    @staticmethod
    def identity(path: Path) -> tuple[int, int, int]:
        stat = os.stat(path)
        return stat.st_size, stat.st_mtime_ns, stat.st_ino

    def check(self) -> None:
        try:
            now = self.identity(self.path)
        except OSError as error:
            now, change = None, f"it is gone ({error.strerror})"
        if now == self.stat:
            return
        if now is not None:
            change = ("it was cut to or grown to" if now[0] != self.stat[0] else "it was rewritten, now") + \
                f" {now[0]:,} bytes (mapped with {self.stat[0]:,})"
        raise self._changed(change)

    def check_rows(self, rows: torch.Tensor, index) -> None:
        """`rows` (as read, in the feature dtype) are the rows `index` (a slice or positions) as the run wrote them."""
        differing = int((row_checksums(rows).cpu() != self.row_checksums[index]).sum())
        if differing:
            raise self._changed(f"{differing} of the {len(rows)} rows just read differ from those this run wrote "
                                "(its size, time and inode unchanged)")  # fmt: skip

    def _changed(self, change: str) -> "ShardChanged":
        return ShardChanged(
            f"The probe feature cache {self.path} changed while this run read it: {change}. Another process wrote to "
            "the run's folder; the run stopped before training on other bytes. Run the same command again (with "
            "--resume_from_checkpoint latest if it checkpointed): the cache is built anew."
        )


def map_shard(writer: ShardWriter, np_dtype, shape: tuple[int, ...], checksums: torch.LongTensor):
    """
    The shard `writer` wrote as a memmap of `shape`, verified against what it wrote, and its ShardWatch (with the
    rows' `checksums`); ShardChanged (naming the shard) when it does not verify.
    """
    path = writer.path
    expected_bytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
    identity = ShardWatch.identity(path)
    problem = shard_problem(writer, expected_bytes)
    if problem is not None:
        raise ShardChanged(f"The probe feature cache {path} does not verify: {problem}.")
    features = np.memmap(path, dtype=np_dtype, mode="r+", shape=shape)  # r+: torch takes only writable arrays
    return features, ShardWatch(path, identity, checksums)


def build_verified(build, label: str, print_fn=print):
    """`build()` (a cache built and mapped); a shard that does not verify when mapped is built once more."""
    try:
        return build()
    except ShardChanged as error:
        print_fn(f"{error} Building the {label} cache again.")
        return build()
