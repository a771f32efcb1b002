"""
A folder's checksum manifest: the sha256 of every file, written last, so that a folder whose manifest verifies is
exactly the folder that was written. The format is sha256sum's: `cd FOLDER && sha256sum -c checksums.sha256`.
Also the fingerprint of a set of files (size and sha256 of each), which a checkpoint records of the run's data.
"""

import functools
import hashlib
import os
from pathlib import Path

from ..utils.atomic import write_text_atomically

MANIFEST_NAME = "checksums.sha256"


def sha256_of(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()  # read in chunks


@functools.cache
def _sha256_until_changed(path: str, size: int, mtime_ns: int) -> str:
    """sha256_of, read once while the file keeps its size and modification time (an edit changes the time)."""
    return sha256_of(Path(path))


def files_fingerprint(files: list[str]) -> dict[str, dict]:
    """{file: {"size", "sha256"}}; a file hashed before by this process, and unchanged since, is not read again."""
    fingerprint = {}
    for file in files:
        stat = os.stat(file)
        sha256 = _sha256_until_changed(file, stat.st_size, stat.st_mtime_ns)
        fingerprint[file] = {"size": stat.st_size, "sha256": sha256}
    return fingerprint


def write_manifest(folder: str | os.PathLike) -> Path:
    """Checksum every file under `folder` (but the manifest) into folder/checksums.sha256, atomically."""
    folder = Path(folder)
    files = sorted(path for path in folder.rglob("*") if path.is_file() and path.name != MANIFEST_NAME)
    lines = [f"{sha256_of(path)}  {path.relative_to(folder).as_posix()}\n" for path in files]
    return write_text_atomically(folder / MANIFEST_NAME, "".join(lines))


def read_manifest(folder: Path) -> dict[str, str]:
    """{relative path: sha256} of folder's manifest; ValueError when a line is not `HEX  PATH`."""
    checksums = {}
    for line in (folder / MANIFEST_NAME).read_text(encoding="utf-8").splitlines():
        checksum, separator, name = line.partition("  ")
        if not separator or len(checksum) != 64 or not name:
            raise ValueError(line)
        checksums[name] = checksum
    if not checksums:
        raise ValueError("no entry")
    return checksums


def manifest_problem(folder: str | os.PathLike) -> str | None:
    """What keeps `folder` from matching its manifest (naming the file), or None when every file verifies."""
    folder = Path(folder)
    manifest = folder / MANIFEST_NAME
    if not manifest.is_file():
        return f"{manifest} is missing (the checkpoint was not completely written, or predates checksums)"
    try:
        checksums = read_manifest(folder)
    except (ValueError, UnicodeDecodeError):
        return f"{manifest} is corrupt"
    for name, checksum in checksums.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if sha256_of(path) != checksum:
            return f"{path} {'is empty' if path.stat().st_size == 0 else 'differs from its checksum'} in {manifest}"
    return None
