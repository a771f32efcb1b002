"""Shared fixtures: paths into ../shared/data (never copied into the repo) and offline mode."""

import os
from pathlib import Path

import pytest
import torch

# Tests never touch the network: the Hub is unreachable on CI machines.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Tiny test models spend more time synchronising threads than computing; one thread per process (subprocesses
# such as the 2-process torchrun runs inherit it) is many times faster on a 2-core machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(1)

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
