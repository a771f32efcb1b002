"""
Checks of the probe phase's feature cache: the budget of an explicit `--probe_feature_cache`, and the integrity of a
disk cache's shards (one file per split and process).

A shard's sha256 and size are written beside it (SHARD.sha256) when it is built, and checked when it is mapped: a
shard that does not verify is built again, never trained on. While the run reads a mapped shard, every read first
compares the file's size, modification time and inode with those it was mapped with, so a shard truncated, rewritten
or replaced under the run stops it with one error instead of training on other bytes. The size is checked before
anything is mapped (numpy would extend a short file with zeros); a truncation in the instant between that check and
a read still ends the process with SIGBUS, which no Python code can catch.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .utils.atomic import readable_bytes
from .utils.errors import TwoTowerUserError

CHECKSUM_SUFFIX = ".sha256"
READ_CHUNK = 1 << 20


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


def checksum_file(shard: Path) -> Path:
    return shard.with_name(shard.name + CHECKSUM_SUFFIX)


class ShardWriter:
    """A shard's file, hashed as it is written; closing it writes the checksum file beside it."""

    def __init__(self, path: Path):
        self.path, self.file, self.hash, self.bytes = Path(path), open(path, "wb"), hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.file.write(data)
        self.hash.update(data)
        self.bytes += len(data)

    def close(self) -> None:
        self.file.close()
        record = {"sha256": self.hash.hexdigest(), "bytes": self.bytes}
        checksum_file(self.path).write_text(json.dumps(record) + "\n")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def shard_problem(path: Path, expected_bytes: int) -> str | None:
    """Why a shard does not verify against its checksum file and the size its rows take, or None."""
    try:
        record = json.loads(checksum_file(path).read_text())
        size = path.stat().st_size
    except (OSError, ValueError) as error:
        return f"its checksum or file cannot be read ({error})"
    if size != expected_bytes or record.get("bytes") != expected_bytes:
        return f"it holds {size:,} bytes, its rows take {expected_bytes:,} (checksum file: {record.get('bytes')})"
    if _sha256(path) != record.get("sha256"):
        return "its bytes do not match the sha256 written when it was built"
    return None


@dataclass
class ShardWatch:
    """What a mapped shard was when mapped; `check` before every read stops the run if the file changed since."""

    path: Path
    stat: tuple[int, int, int]  # size, modification time (ns), inode

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
        raise ShardChanged(
            f"The probe feature cache {self.path} changed while this run read it: {change}. Another process wrote to "
            "the run's folder; the run stopped before training on other bytes. Run the same command again (with "
            "--resume_from_checkpoint latest if it checkpointed): the cache is built anew."
        )


def map_shard(path: Path, np_dtype, shape: tuple[int, ...]) -> tuple[np.memmap, ShardWatch]:
    """The verified shard as a memmap of `shape`; ShardChanged (naming the shard) when it does not verify."""
    expected_bytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
    identity = ShardWatch.identity(path)
    problem = shard_problem(path, expected_bytes)
    if problem is not None:
        raise ShardChanged(f"The probe feature cache {path} does not verify: {problem}.")
    features = np.memmap(path, dtype=np_dtype, mode="r+", shape=shape)  # r+: torch takes only writable arrays
    return features, ShardWatch(path, identity)


def build_verified(build, label: str, print_fn=print):
    """`build()` (a cache built and mapped); a shard that does not verify when mapped is built once more."""
    try:
        return build()
    except ShardChanged as error:
        print_fn(f"{error} Building the {label} cache again.")
        return build()
