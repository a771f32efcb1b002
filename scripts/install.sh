#!/usr/bin/env bash
# Creates .venv (if missing) with the CPU build of PyTorch and twotower pinned to the tested versions.
# Sourced by scripts/test.sh and scripts/train_tiny.sh. On a GPU machine install torch your usual way instead.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ ! -x "$repo/.venv/bin/python" ]; then
  python3 -m venv "$repo/.venv"
fi
# shellcheck disable=SC1091
. "$repo/.venv/bin/activate"
if ! python -c "import modeling_twotower, twotower.training, pytest, mkdocs" 2>/dev/null; then
  python -m pip install -q --upgrade pip
  # The pin matters: an unpinned torch pulls a multi-GB CUDA build; 2.13.0 is the CPU wheel.
  python -m pip install -q torch==2.13.0
  python -m pip install -q -c "$repo/constraints.txt" -e "$repo[test]"
fi
