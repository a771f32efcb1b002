"""The Python examples of the README and docs/ run as written, and the documentation site builds strictly."""

import json
import linecache
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from training.tokenizer import load_tokenizer, padded_vocab_size
from twotower.evaluation.study.document import summary_lines

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
# A fenced example preceded by this comment is not run, e.g. one that needs the Hub; the comment says why.
NOT_RUN = re.compile(r"<!-- not run: [^>]+ -->\n+```python\n.*?```", re.S)
EXAMPLE = re.compile(r"```python\n(.*?)```", re.S)


def python_examples(page: Path) -> list[str]:
    return EXAMPLE.findall(NOT_RUN.sub("", page.read_text(encoding="utf-8")))


def test_readme_is_short_and_its_links_resolve():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme):
        if not target.startswith("http"):
            assert (REPO / target).exists(), f"README links to missing {target}"


def test_readme_states_the_studys_verdicts_as_study_json_has_them():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## What reproduces at CPU scale", 1)[1].split("\n## ", 1)[0]
    verdicts = json.loads((REPO / "docs" / "study" / "study.json").read_text(encoding="utf-8"))["verdicts"]
    assert verdicts
    for line in summary_lines(verdicts):
        assert line in section


@pytest.fixture()
def main_job_layout(tmp_path, gpt2_tokenizer_dir, monkeypatch):
    """A working directory laid out as after the main job: the repository's folders and a model with probes."""
    for folder in ("data", "evaluation"):
        (tmp_path / folder).symlink_to(REPO / folder)
    tokenizer = load_tokenizer(str(gpt2_tokenizer_dir))
    config = TwoTowerConfig.from_preset("tiny", vocab_size=padded_vocab_size(tokenizer), probe_replicas=2)
    model_dir = tmp_path / "outputs" / "tiny" / "probe" / "model"
    TwoTowerForCausalLM(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page", [p for p in PAGES if python_examples(p)], ids=lambda p: str(p.relative_to(REPO)))
def test_python_examples_run(page, main_job_layout, capsys):
    namespace = {"__name__": "__docs__"}
    for index, example in enumerate(python_examples(page)):  # in order, in one namespace, as a reader would paste them
        name = f"{page.name} example {index + 1}"
        linecache.cache[name] = (len(example), None, example.splitlines(keepends=True), name)  # nnsight reads it
        exec(compile(example, name, "exec"), namespace)


def test_documentation_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("TwoTowerForCausalLM") > 0
