"""Atomic writes: nothing a user keeps is ever left half-written, a file or a whole folder."""

import errno
import os
import shutil
import tempfile
from pathlib import Path

from .errors import TwoTowerUserError


def is_disk_full(error: BaseException | None) -> bool:
    """Whether `error`, or an error it was raised from, is "No space left on device" (ENOSPC)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        error = error.__cause__
    return False


def disk_full_error(target: str | os.PathLike, partial: str | os.PathLike) -> TwoTowerUserError:
    """The one-line message of a full disk: what was being written, and that its partial copy is gone."""
    return TwoTowerUserError(
        f"No space left on device while writing {target}; its partial copy {partial} was removed. Free space on "
        f"that disk (or choose another folder) and run again."
    )


def current_umask() -> int:
    """The process's umask (reading it means setting it: set it straight back)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def write_atomically(path: str | os.PathLike, write) -> Path:
    """Call `write(tmp_path)` on a temporary file in path's folder, then rename it to `path`."""
    path = Path(path)
    descriptor, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes the file private (0600); give it the user's umask
        os.replace(tmp, path)
    except BaseException as error:
        os.unlink(tmp)
        if is_disk_full(error):
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
