"""Atomic writes: nothing a user keeps is ever left half-written, a file or a whole folder."""

import os
import shutil
import tempfile
from pathlib import Path


def write_atomically(path: str | os.PathLike, write) -> Path:
    """Call `write(tmp_path)` on a temporary file in path's folder, then rename it to `path`."""
    path = Path(path)
    descriptor, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(descriptor)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
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
