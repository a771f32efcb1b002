"""
One run per output folder: the main process checks the folder writable and locks it for the run's lifetime, with its
PID beside the lock; a second run on the folder fails at once, on every one of its processes. The lock file is
removed when the run ends (a run killed with -9 leaves it, unlocked and harmless).
"""

import contextlib
import fcntl
import os
import socket
import tempfile
from pathlib import Path

from .collective import on_main_process
from .errors import TwoTowerUserError

LOCK_NAME = ".run.lock"
HOLDER_NAME = ".run.lock.pid"  # beside the lock: the PID and host of the run holding it


def check_writable(output_dir: str | os.PathLike) -> None:
    """Create output_dir if needed and write a file in it: a folder that cannot take the run fails now."""
    folder = Path(output_dir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise TwoTowerUserError(
            f"--output_dir {folder} cannot be written ({error.strerror or error}): choose a folder you can write "
            f"to, or fix its permissions."
        ) from error


def _holder(folder: Path) -> str:
    try:
        pid, host = (folder / HOLDER_NAME).read_text().split()
    except (OSError, ValueError):  # the holder has not written it yet
        return "process unknown"
    return f"process {pid} on {host}"


def _lock(path: Path) -> int | None:
    """
    An open descriptor of `path` holding its exclusive flock (released by the system when the process dies), or
    None when another process holds it.
    """
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            return None
        try:
            if os.path.samestat(os.fstat(descriptor), os.stat(path)):
                return descriptor
        except FileNotFoundError:
            pass
        # The previous holder removed the file between our open and our flock: we locked its removed copy, which
        # locks nothing. Open the file now at `path` instead.
        os.close(descriptor)


@contextlib.contextmanager
def output_dir_lock(output_dir: str | os.PathLike):
    """Hold output_dir's lock, with this process's PID beside it; when another process holds it, fail at once."""
    folder = Path(output_dir)
    descriptor = _lock(folder / LOCK_NAME)
    if descriptor is None:
        raise TwoTowerUserError(
            f"--output_dir {folder} is in use by another run ({_holder(folder)}, written in {folder / HOLDER_NAME}): "
            f"wait for it to end, or choose another --output_dir."
        )
    try:
        (folder / HOLDER_NAME).write_text(f"{os.getpid()} {socket.gethostname()}\n")
        yield
    finally:
        # Removed while still locked: a process that opens it now locks a removed copy, sees that, and opens anew
        (folder / HOLDER_NAME).unlink(missing_ok=True)
        (folder / LOCK_NAME).unlink(missing_ok=True)
        os.close(descriptor)


@contextlib.contextmanager
def locked_output_dir(accelerator, output_dir: str | os.PathLike):
    """The main process checks output_dir writable and holds its lock until the run ends; every process fails if not."""
    with contextlib.ExitStack() as held:

        def take():
            check_writable(output_dir)
            held.enter_context(output_dir_lock(output_dir))

        on_main_process(accelerator, take)
        yield
