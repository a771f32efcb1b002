"""How every command of the package ends on an error: a mistake of the user is one line, anything else a traceback.

Each command's `__main__` block is `run(main)`, and its parser a `CommandParser` (or `options.OptionsParser`, whose
errors raise too). A TwoTowerUserError, a FileNotFoundError, a full disk or a bad command line prints
`error: MESSAGE` on one line of stderr and exits with status 2 (argparse's status for a bad command line);
`--debug` anywhere on the command line, or TWOTOWER_DEBUG=1, shows the traceback instead. Any other exception is a
bug, and keeps its traceback.
"""

import argparse
import errno
import os
import sys

from .errors import TwoTowerUserError

DEBUG_FLAG = "--debug"
DEBUG_VARIABLE = "TWOTOWER_DEBUG"
USER_ERROR_STATUS = 2


def command_name() -> str | None:
    """The running command as its user typed it, for `--help`'s usage line: `python -m twotower.training.train` for a
    module run with `-m` (where argparse would name its file, `train.py`); None (argparse's default) otherwise."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return f"python -m {spec.name.removesuffix('.__main__')}" if spec is not None else None


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors raise instead of printing the usage and exiting, so that `run` owns the output;
    its usage line names the command as typed."""

    def __init__(self, **kwargs):
        super().__init__(**({"prog": command_name()} | kwargs))

    def error(self, message):
        raise TwoTowerUserError(f"{self.prog}: {message} (`--help` lists the options)")


def is_user_error(error: BaseException) -> bool:
    """Whether `error` is the user's to fix (a bad option, a missing file, a full disk) rather than a bug."""
    if isinstance(error, (TwoTowerUserError, FileNotFoundError)):
        return True
    return isinstance(error, OSError) and error.errno == errno.ENOSPC


def run(main, argv: list[str] | None = None):
    """Call `main(argv)` as a command; see the module docstring for what an error prints."""
    if argv is None:
        argv = sys.argv[1:]
        sys.argv[1:] = [arg for arg in argv if arg != DEBUG_FLAG]  # for a main that reads sys.argv itself
    debug = DEBUG_FLAG in argv or os.environ.get(DEBUG_VARIABLE, "0") not in ("", "0")
    try:
        return main([arg for arg in argv if arg != DEBUG_FLAG])
    except Exception as error:
        if debug or not is_user_error(error):
            raise
        print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
        sys.exit(USER_ERROR_STATUS)
