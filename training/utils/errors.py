"""The error a user can cause and fix (bad option, folder, file): the CLIs print it as one line, no traceback."""


class TwoTowerUserError(ValueError):
    """A mistake in what the user passed; its message names the value and the fix."""
