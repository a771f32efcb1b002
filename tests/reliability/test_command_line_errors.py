"""Clean failures: every command prints a user's mistake as one line `error: ...` on stderr and exits with 2, with
the traceback behind `--debug` (or TWOTOWER_DEBUG=1); a bug keeps its traceback."""

import errno
import runpy
import subprocess
import sys

import pytest

from conftest import HANG_LIMIT_S
from modeling_twotower.configuration_twotower import TOWER_TYPES

from twotower.training.utils import cli
from twotower.training.utils.errors import TwoTowerUserError

# runpy runs a module already imported by the suite again, as `python -m` would run it: expected here
pytestmark = pytest.mark.filterwarnings("ignore:.*found in sys.modules after import of package:RuntimeWarning")


def run_command(module, argv, monkeypatch, capsys):
    """Run `python -m module argv` in this process (its own `__main__` block); returns (exit status, stderr)."""
    monkeypatch.setattr(sys, "argv", [module, *argv])
    with pytest.raises(SystemExit) as exited:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
    return exited.value.code, capsys.readouterr().err


# module, command line, what the one line says
USER_ERRORS = {
    "train: zero steps": (
        "twotower.training.train", ["--recipe", "tiny", "--max_train_steps", "0"], "`max_train_steps` must be >= 1"
    ),
    "train: unknown recipe": ("twotower.training.train", ["--recipe", "tinyy"], "Recipe 'tinyy' not found"),
    "train: bad number": (
        "twotower.training.train", ["--learning_rate", "fast"], "invalid float value: 'fast'"
    ),
    "train: misspelt option": ("twotower.training.train", ["--max_trian_steps", "3"], "did you mean `max_train_steps`"),
    "score: alpha of 2": (
        "twotower.evaluation.scoring.score", ["--model_dir", "m", "--output_dir", "o", "--alpha", "2"],
        "`alpha` must be in",
    ),
    "score: no model folder": (
        "twotower.evaluation.scoring.score", ["--model_dir", "missing", "--output_dir", "o"], "has no config.json"
    ),
    "score: required option missing": (
        "twotower.evaluation.scoring.score", ["--output_dir", "o"], "the following arguments are required: --model_dir"
    ),
    "compare: not report folders": (
        "twotower.evaluation.compare", ["a", "b", "--output_dir", "c"], "is not a tower preference report"
    ),
    "compare: no arguments": ("twotower.evaluation.compare", [], "the following arguments are required"),
    "study: unknown recipe": (
        "twotower.evaluation.study", ["--recipe", "nope", "--data_dir", ".", "--output_dir", "o"], "Recipe 'nope'"
    ),
    "publish: no model folder": (
        "twotower.evaluation.publishing.publish", ["--model_dir", "missing", "--repo_id", "a/b", "--output_dir", "o"],
        "has no config.json",
    ),
    "publish_metric: wrong Space name": (
        "twotower.evaluation.publishing.publish_metric", ["--output_dir", "o", "--repo_id", "me/metric", "--dry-run"],
        "must be `user/tower_preference`",
    ),
    "lm_eval_wikitext: no WikiText": (
        "twotower.evaluation.lm_eval_wikitext", ["--wikitext_dir", "missing", "--output_dir", "o"], "not found"
    ),
}


@pytest.mark.parametrize("case", USER_ERRORS)
def test_a_user_error_is_one_line_without_a_traceback(case, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)
    module, argv, message = USER_ERRORS[case]
    status, stderr = run_command(module, argv, monkeypatch, capsys)
    assert status == cli.USER_ERROR_STATUS == 2
    assert stderr.startswith("error: ") and stderr.count("\n") == 1, stderr
    assert message in stderr and "Traceback" not in stderr
    assert not (tmp_path / "o").exists()  # nothing was written before the error


def test_debug_shows_the_traceback(monkeypatch):
    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)
    monkeypatch.setattr(sys, "argv", ["train", "--recipe", "tiny", "--max_train_steps", "0", "--debug"])
    with pytest.raises(TwoTowerUserError, match="`max_train_steps` must be >= 1"):
        runpy.run_module("twotower.training.train", run_name="__main__", alter_sys=False)
    monkeypatch.setenv(cli.DEBUG_VARIABLE, "1")
    monkeypatch.setattr(sys, "argv", ["train", "--recipe", "tiny", "--max_train_steps", "0"])
    with pytest.raises(TwoTowerUserError, match="`max_train_steps` must be >= 1"):
        runpy.run_module("twotower.training.train", run_name="__main__", alter_sys=False)


def test_what_run_catches_and_what_it_lets_through(monkeypatch, capsys):
    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)

    def failing(error):
        def main(argv):
            raise error
        return main

    disk_full = OSError(errno.ENOSPC, "No space left on device", "/data/out")
    for error in (TwoTowerUserError("bad\nvalue"), FileNotFoundError("no such\n file"), disk_full):
        with pytest.raises(SystemExit) as exited:
            cli.run(failing(error), [])
        assert exited.value.code == 2
        assert capsys.readouterr().err.count("\n") == 1  # newlines in a message are folded into one line
    for bug in (RuntimeError("a bug"), KeyError("key"), OSError(errno.EIO, "I/O error")):
        with pytest.raises(type(bug)):
            cli.run(failing(bug), [])
    assert cli.run(lambda argv: argv, ["--a", "--debug", "b"]) == ["--a", "b"]  # main never sees --debug


def test_help_names_the_command_as_it_is_run():
    # `python -m` runs the module's file: argparse alone would name it, `usage: train.py` (every command's parser is
    # an OptionsParser, which names the module)
    shown = subprocess.run([sys.executable, "-m", "twotower.training.train", "--help"], capture_output=True, text=True,
                           check=True, timeout=HANG_LIMIT_S).stdout  # fmt: skip
    assert shown.startswith("usage: python -m twotower.training.train [-h]")
    # every tower kind the model accepts is named in its option's help
    assert f"{' | '.join(TOWER_TYPES)} (None: the layout's;" in " ".join(shown.split())
