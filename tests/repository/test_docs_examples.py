"""The Python examples of the README and docs/ run as written, and the documentation site builds strictly."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM
from training.data.tokenizer import load_tokenizer, padded_vocab_size
from conftest import HANG_LIMIT_S

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
def test_python_examples_run(page, main_job_layout):
    # in order, in one script, as a reader would paste them; in a process of its own, since nnsight patches torch
    # (backward, among others) for the process that traces
    script = main_job_layout / f"{page.stem}_examples.py"
    script.write_text("\n".join(python_examples(page)), encoding="utf-8")
    result = subprocess.run([sys.executable, str(script)], cwd=main_job_layout, capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=HANG_LIMIT_S)
    assert result.returncode == 0, result.stderr[-3000:]


def test_documentation_site_builds_strictly(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")], cwd=REPO, env=env,
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("TwoTowerForCausalLM") > 0
