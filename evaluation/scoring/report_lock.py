"""
A report folder is locked while a report is scored into it, as a training run's folder is (the same flock, held from
before the model is loaded to the last file moved in): a second `score` into the folder fails at once, naming the
process that holds it, instead of losing its whole scoring pass at the end.
"""

import functools
import tempfile
from pathlib import Path

from twotower.training.run.run_folder import output_dir_lock


def report_folder_locked(score):
    """`score(model_dir, output_dir, **options)` run holding output_dir's lock (a folder it had to create for the lock
    and left empty is removed again, so that a refused call leaves nothing behind)."""

    @functools.wraps(score)
    def locked(model_dir, output_dir, **options):
        folder = Path(output_dir)
        created = not folder.exists()
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError:  # a file in its path, a read-only folder: check_output_dir names why, before any work
            return score(model_dir, output_dir, **options)
        try:
            with output_dir_lock(folder):
                return score(model_dir, output_dir, **options)
        finally:
            if created and folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()

    return locked
