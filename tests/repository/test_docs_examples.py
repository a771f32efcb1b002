"""The README's and docs/' examples run as written: the Python ones, and the shell commands that follow the main job
(against its folders); and the documentation site builds strictly."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import HANG_LIMIT_S
from main_job_folders import make_main_job_folders

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# A fenced example preceded by this comment is not run, e.g. one that needs the Hub or trains for minutes; the
# comment says why.
NOT_RUN = re.compile(r"<!-- not run: [^>]+ -->\n+```(?:python|bash)\n.*?```", re.S)
# Every such comment (at a line's start: one quoted in a sentence marks nothing), with what follows it
MARKER = re.compile(r"^<!-- not run\b(.*?)-->(\s*)(```\w*)?", re.S | re.M)
PYTHON_EXAMPLE = re.compile(r"```python\n(.*?)```", re.S)
SHELL_EXAMPLE = re.compile(r"```bash\n(.*?)```", re.S)
# A path the commands read or write: after the main job, under its folders or beside them
OUTPUTS_PATH = re.compile(r"\boutputs/[\w./-]*\w")


def examples(page: Path, fence: re.Pattern) -> list[str]:
    return fence.findall(NOT_RUN.sub("", page.read_text(encoding="utf-8")))


def commands_after_the_main_job(page: Path) -> list[str]:
    """The page's shell examples that name a folder under outputs/: they follow the main job, so run after it."""
    return [block for block in examples(page, SHELL_EXAMPLE) if OUTPUTS_PATH.search(block)]


def test_readme_is_short_and_its_links_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links to missing {target}"


@pytest.fixture(scope="session")
def main_job_folders(tmp_path_factory, shared_data) -> Path:
    return make_main_job_folders(tmp_path_factory.mktemp("main-job"), shared_data).parent


@pytest.fixture()
def main_job_layout(tmp_path, main_job_folders, monkeypatch) -> Path:
    """A working directory laid out as a clone after the main job, a copy of its own for each test: the repository's
    folders, the main job's outputs, and the shared data beside it (../shared/data/wikitext-2, sliced)."""
    shutil.copytree(main_job_folders, tmp_path, symlinks=True, dirs_exist_ok=True)
    monkeypatch.chdir(tmp_path / "repository")
    return tmp_path / "repository"


def test_every_example_not_run_says_why():
    for page in PAGES:
        for reason, space, fence in MARKER.findall(page.read_text(encoding="utf-8")):
            name = page.relative_to(REPO)
            assert re.fullmatch(r": \S[^\n]* ", reason) and len(reason.split()) >= 3, f"{name}: <!-- not run{reason}-->"
            assert fence in ("```python", "```bash") and space.count("\n") >= 1, f"{name}: a marker on no example"


@pytest.mark.parametrize("page", [p for p in PAGES if examples(p, PYTHON_EXAMPLE)],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_python_examples_run(page, main_job_layout):
    # in order, in one script, as a reader would paste them; in a process of its own, since nnsight patches torch
    # (backward, among others) for the process that traces
    script = main_job_layout / f"{page.stem}_examples.py"
    script.write_text("\n".join(examples(page, PYTHON_EXAMPLE)), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=main_job_layout, capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=HANG_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("page", [p for p in PAGES if commands_after_the_main_job(p)],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_shell_examples_run_after_the_main_job(page, main_job_layout):
    # in order, in one script, as a reader would paste them, with this environment's python and lm_eval first
    blocks = commands_after_the_main_job(page)
    script = main_job_layout / f"{page.stem}_examples.sh"
    script.write_text("set -euo pipefail\n" + "\n".join(blocks), encoding="utf-8")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    result = subprocess.run(["bash", str(script)], cwd=main_job_layout, capture_output=True, text=True, env=env,
                            timeout=HANG_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    for named in OUTPUTS_PATH.findall("\n".join(blocks)):  # what they read is there, and what they write was written
        assert (main_job_layout / named).exists(), f"{page.name} names {named}, which no command wrote"


def test_documentation_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("TwoTowerForCausalLM") > 0
