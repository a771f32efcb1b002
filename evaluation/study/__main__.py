"""`python -m twotower.evaluation.study`: run a study recipe (see driver.py)."""

from twotower.training.utils.cli import run

from .driver import main

run(main)
