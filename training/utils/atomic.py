"""Atomic writes: nothing a user keeps is ever left half-written, a file or a whole folder."""

import errno
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from .errors import TwoTowerUserError

RUN_AGAIN = "Free space on that disk (or choose another folder) and run again."
# The Rust writers (safetensors, tokenizers) raise their own exceptions, which end with the OS's error number
RUST_DISK_FULL = f"(os error {errno.ENOSPC})"
# torch.save's zip writer names no cause ("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
TORCH_WRITER_FAILURE = "inline_container.cc"
FULL_DISK_BYTES = 1 << 20  # a disk with less free is full: a failed write fills it to its last block


def is_disk_full(error: BaseException | None, folder: str | os.PathLike | None = None) -> bool:
    """
    Whether `error`, or an error it was raised from or while handling, is "No space left on device": an OSError
    with ENOSPC, a safetensors or tokenizers error ending "(os error 28)", or torch.save's writer failing while the
    disk of `folder` (what was being written) has under a megabyte free.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or RUST_DISK_FULL in str(error):
            return True
        if folder is not None and TORCH_WRITER_FAILURE in str(error) and free_bytes(folder) < FULL_DISK_BYTES:
            return True
        error = error.__cause__ or error.__context__
    return False


def free_bytes(folder: str | os.PathLike) -> int:
    """Free bytes on the disk of `folder`, or of its nearest folder that exists."""
    folder = Path(folder)
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def readable_bytes(num_bytes: float) -> str:
    """Decimal units, as disks are sold: 158.9 GB."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= size:
            return f"{num_bytes / size:.1f} {unit}"
    return f"{num_bytes:.0f} B"


def disk_full_error(
    target: str | os.PathLike, partial: str | os.PathLike, advice: str = RUN_AGAIN
) -> TwoTowerUserError:
    """The one-line message of a full disk: what was being written, that its partial copy is gone, what to do."""
    return TwoTowerUserError(
        f"No space left on device while writing {target}; its partial copy {partial} was removed. {advice}"
    )


def current_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def apply_umask(path: str | os.PathLike) -> None:
    """Give `path` the mode the user's umask gives a new file: mkstemp, and safetensors' own temporary file, make it
    private (0600)."""
    os.chmod(path, 0o666 & ~current_umask())


def apply_umask_to_folder(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            apply_umask(path)


def write_atomically(path: str | os.PathLike, write) -> Path:
    """Call `write(tmp_path)` on a temporary file in path's folder, then rename it to `path`."""
    path = Path(path)
    descriptor, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    try:
        write(tmp)
        apply_umask(tmp)
        os.replace(tmp, path)
    except BaseException as error:
        os.unlink(tmp)
        if is_disk_full(error, path.parent):
            raise disk_full_error(path, tmp) from error
        raise
    return path


def write_text_atomically(path: str | os.PathLike, text: str) -> Path:
    return write_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def fresh_staging_folder(final: Path) -> Path:
    """An empty temporary sibling of `final`, where a folder is written before `replace_folder` renames it."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def replace_folder(tmp: Path, final: Path) -> None:
    """Move a completely written `tmp` folder to `final`, replacing what was there."""
    old = final.with_name(f".{final.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def staged_folder(final: Path, make_staging=fresh_staging_folder, replace=replace_folder):
    """
    Yield an empty staging folder (`make_staging(final)`) to write into: `replace(staging, final)` puts it in place
    of `final` when the block ends; it is removed when the block fails (a full disk raised as one clear error), so
    `final` is never half-written.
    """
    staging = make_staging(final)
    try:
        yield staging
    except BaseException as error:
        shutil.rmtree(staging, ignore_errors=True)
        if is_disk_full(error):
            raise disk_full_error(final, staging) from error
        raise
    replace(staging, final)
