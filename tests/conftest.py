"""Shared fixtures: paths into ../shared/data (never copied into the repo) and offline mode."""

import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

# Tests never touch the network: the Hub is unreachable on CI machines. Set before transformers (and with it
# huggingface_hub, which reads it once) is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# The training tests load corpora written to fresh temporary folders, and datasets caches each one (its Arrow files
# and tokenized blocks) under ~/.cache/huggingface/datasets, where nothing removes them: 5 GB on one development
# machine, which filled its disk. The suite's cache lives and dies with its process (each worker, and the
# processes it launches, which inherit the variable). Set before datasets, which reads it once, is imported.
_DATASETS_CACHE = tempfile.TemporaryDirectory(prefix="twotower-tests-datasets-")
os.environ["HF_DATASETS_CACHE"] = _DATASETS_CACHE.name
# Tiny test models spend more time synchronising threads than computing; one thread per process (subprocesses
# such as the 2-process torchrun runs inherit it) is many times faster on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

from modeling_twotower import TwoTowerConfig, TwoTowerForCausalLM  # noqa: E402 (after the offline settings)

# The suite's tiny-model factory. Odd sizes by default, so that a mis-reshaped tensor fails loudly (transformers'
# model testers do the same); tests import it (`from conftest import tiny_two_tower`) and override what they need.
TINY_SIZES = dict(
    vocab_size=99, hidden_size=12, num_hidden_layers=2, num_attention_heads=3, intermediate_size=37,
    max_position_embeddings=32,
)  # fmt: skip


# How long a test waits for a child process (a launch, a script, a page's examples) before calling it hung. The
# limits exist to catch hangs, not slowness: a loaded CI machine runs children several times slower than an idle one
# (docs/development.md gives the slowest child measured at a load of 8 on 2 cores).
HANG_LIMIT_S = 1200


def tiny_two_tower_config(**config):
    """The config of `tiny_two_tower`: `config` overrides TINY_SIZES or sets any other TwoTowerConfig field."""
    return TwoTowerConfig(**{**TINY_SIZES, **config})


def tiny_two_tower(model_class=TwoTowerForCausalLM, seed=0, **config):
    """A tiny two-tower model in eval mode, its weights drawn from `seed`; `config` overrides TINY_SIZES or sets any
    other TwoTowerConfig field."""
    torch.manual_seed(seed)
    return model_class(tiny_two_tower_config(**config)).eval()


SHARED_DATA = Path(os.environ.get("TWOTOWER_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


# CI sets it: there a missing shared/data folder is a broken machine, not a reason to skip half the suite.
REQUIRE_SHARED_DATA = os.environ.get("TWOTOWER_REQUIRE_SHARED_DATA", "0") == "1"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The corpora and tokenizer files beside the repository; the tests that need them skip where they are absent."""
    if not SHARED_DATA.is_dir():
        message = f"needs the shared corpora at {SHARED_DATA} (set TWOTOWER_SHARED_DATA to the shared/data folder)"
        if REQUIRE_SHARED_DATA:
            pytest.fail(f"{message}; TWOTOWER_REQUIRE_SHARED_DATA=1 makes their absence an error")
        pytest.skip(message)
    return SHARED_DATA


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(shared_data) -> Path:
    return shared_data / "tokenizers" / "gpt2"


# CI sets it: there Chromium and Playwright are installed (.ci/run), so their absence is a broken install.
REQUIRE_BROWSER = os.environ.get("TWOTOWER_REQUIRE_BROWSER", "0") == "1"
CHROMIUM = os.environ.get("TWOTOWER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (Debian's package: `apt-get install chromium`) driven by Playwright; the browser tests skip
    where either is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = "needs Playwright (pip install playwright, in the test extra)"
    else:
        missing = None if CHROMIUM else "needs Chromium (apt-get install chromium, or TWOTOWER_CHROMIUM=its path)"
    if missing:
        if REQUIRE_BROWSER:
            pytest.fail(f"{missing}; TWOTOWER_REQUIRE_BROWSER=1 makes its absence an error")
        pytest.skip(missing)
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium's sandbox refuses to start as root, which CI containers are
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()
