"""
A report folder's report replaced in one step.

The files of a report live in a version folder inside the report folder, `.report.XXXX`, written whole first (as
`.report.XXXX.tmp`, report.write_report). `.report` is a symbolic link to the current version, and each report file
at the top of the folder is a link through it (`report.md -> .report/report.md`), so readers open the same paths as
before. The new report becomes visible in one rename, `.report` pointed at the new version: a reader, or a run killed
at any instant, sees the whole old report or the whole new one, never a mix. What a killed run leaves behind (its
staging folder or an unused version) is removed by the next report written into the folder, which holds the folder's
lock (report_lock.py). A report of plain files (written before versions) is first moved into a version of its own, a
file at a time, each name showing the same file throughout. The user's other files in the folder are never touched.
"""

import os
import shutil
import tempfile
import uuid
from pathlib import Path

from twotower.training.utils.atomic import current_umask

from .report_files import PER_TOKEN_CSV, PLOTS, PREFERENCE_JSON, REPLICA_PLOTS, REPORT_MD, TOKEN_VIEW_HTML
from .report_files import TYPE_SUMS_PARQUET

CURRENT = ".report"  # the link to the current version
VERSION_PREFIX = ".report."  # the versions, .report.XXXX, and the staging folders and links that become them
STAGING_SUFFIX = ".tmp"  # a staging folder: .report.XXXX.tmp
REPORT_FILES = (PREFERENCE_JSON, PER_TOKEN_CSV, TYPE_SUMS_PARQUET, REPORT_MD, TOKEN_VIEW_HTML, *PLOTS.values(),
                *REPLICA_PLOTS.values())  # fmt: skip


def _new_folder(folder: Path, suffix: str = "") -> Path:
    """A new folder of `folder`, unique to this process, with the mode the user's umask gives (mkdtemp's is 0700)."""
    new = Path(tempfile.mkdtemp(prefix=VERSION_PREFIX, suffix=suffix, dir=folder))
    os.chmod(new, 0o777 & ~current_umask())
    return new


def staging_folder(folder: Path) -> Path:
    """A new folder, unique to this process, where a report is written before it becomes a version."""
    return _new_folder(folder, STAGING_SUFFIX)


def _point(link: Path, target: str) -> None:
    """Make `link` a symbolic link to `target` in one step, whatever it was before (a file, another link, nothing)."""
    temporary = link.with_name(f"{VERSION_PREFIX}{uuid.uuid4().hex}.link")
    os.symlink(target, temporary)
    os.replace(temporary, link)


def _adopt_plain_report(folder: Path) -> None:
    """A report of plain files (written before versions) made the current version, a file at a time: each name shows
    the same file throughout (hard-linked into the version, or copied where the file system has no hard links). An
    adoption a kill cut short goes on where it stopped: its version is the current one."""
    plain = [name for name in REPORT_FILES if (folder / name).is_file() and not (folder / name).is_symlink()]
    if not plain:
        return
    current = folder / CURRENT
    if current.is_symlink():
        version = folder / os.readlink(current)
    else:
        if current.is_dir():  # a report folder copied through its links: a copy of its version, which nothing reads
            current.rename(folder / f"{VERSION_PREFIX}{uuid.uuid4().hex}")
        version = _new_folder(folder)
    for name in plain:
        if (version / name).exists():
            continue
        try:
            os.link(folder / name, version / name)
        except OSError:
            shutil.copy2(folder / name, version / name)
    if not current.is_symlink():
        _point(current, version.name)
    for name in plain:
        _point(folder / name, f"{CURRENT}/{name}")


def _remove_leftovers(folder: Path, version: Path) -> None:
    """Every version, staging folder and temporary link but the current `version`, and each report link whose file
    the current report lacks."""
    for path in folder.glob(f"{VERSION_PREFIX}*"):
        if path.name == version.name:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    for path in folder.iterdir():
        if path.is_symlink() and os.readlink(path).startswith(f"{CURRENT}/") and not path.exists():
            path.unlink()


def replace_report(folder: Path, staging: Path) -> None:
    """Make the report completely written in `staging` (a `staging_folder` of `folder`) the folder's report, in one
    step (module docstring)."""
    folder = Path(folder)
    _adopt_plain_report(folder)
    version = staging.with_name(staging.name.removesuffix(STAGING_SUFFIX))
    os.rename(staging, version)
    # the links of the new report's files, before the step: a name the old report lacks stays missing until then
    for name in sorted(path.name for path in version.iterdir()):
        link = folder / name
        if not (link.is_symlink() and os.readlink(link) == f"{CURRENT}/{name}"):
            _point(link, f"{CURRENT}/{name}")
    _point(folder / CURRENT, version.name)  # the one step
    _remove_leftovers(folder, version)
