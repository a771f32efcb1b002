#!/usr/bin/env bash
# Tests the model at both ends of setup.py's ranges of transformers, accelerate, huggingface-hub, tokenizers and
# safetensors: `floor` (each range's lowest release) and `newest` (pip's newest release within each range), one venv
# each under .venv-ranges/, with torch at the CPU pin (constraints.txt). In each it runs
#   - the modeling tests that need nothing but the model: every tests/modeling file that imports nothing of the
#     `twotower` package (the training and evaluation stack, tested at the pins only), on this checkout's model;
#   - scripts/version_range.py: a tiny model of every tower kind and objective, saved by the pinned .venv as the main
#     job would publish it, loaded as Hub custom code (trust_remote_code=True) where the package is not importable,
#     and checked: logits, generation with and without the cache, probe and joint log-probabilities, ablation.
# Usage: bash scripts/test_version_range.sh [floor] [newest]   (both by default); .ci/run runs it after the suite.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=install.sh
. "$repo/scripts/install.sh"  # the pinned .venv, which saves the models
cd "$repo"
ends=("$@")
[ ${#ends[@]} -gt 0 ] || ends=(floor newest)
twotower_import='^\s*(from|import) twotower\b'
mapfile -t modeling_tests < <(grep -L -E "$twotower_import" tests/modeling/test_*.py)
echo "modeling tests run: ${modeling_tests[*]}"
echo "left out (they import the twotower package): $(grep -l -E "$twotower_import" tests/modeling/test_*.py | xargs)"
torch_pin="$(grep -E '^torch==' constraints.txt)"
pytest_pin="$(grep -E '^pytest==' constraints.txt)"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1

status=0  # every check runs; the exit status says whether any failed
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python scripts/version_range.py save "$work/models"

for end in "${ends[@]}"; do
  case "$end" in floor | newest) ;; *) echo "unknown end '$end': use floor or newest" >&2; exit 2 ;; esac
  venv="$repo/.venv-ranges/$end"
  if [ ! -x "$venv/bin/python" ]; then
    require_free_mb "$repo" 1500 "a new $venv (1.2 GB)"
    python3 -m venv "$venv"
  fi
  # torch first and alone, then the ranges with torch held to it: an unpinned resolve could pull a CUDA build
  "$venv/bin/python" -m pip install -q "$torch_pin"
  mapfile -t requirements < <(python scripts/version_range.py requirements "$end")
  upgrade=()
  [ "$end" = newest ] && upgrade=(--upgrade)
  "$venv/bin/python" -m pip install -q "${upgrade[@]}" "${requirements[@]}" "$torch_pin" "$pytest_pin"
  "$venv/bin/python" - "$torch_pin" << 'EOF'
import importlib.metadata as metadata, sys
import torch
wanted = sys.argv[1].split("==")[1]
assert torch.__version__.split("+")[0] == wanted and torch.version.cuda is None, (torch.__version__, torch.version.cuda)
assert not [d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("nvidia")], "CUDA"
names = ("torch", "transformers", "accelerate", "huggingface_hub", "tokenizers", "safetensors")
print("versions:", ", ".join(f"{name} {metadata.version(name)}" for name in names))
EOF
  echo "== $end: modeling tests"
  PYTHONPATH="$repo" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${modeling_tests[@]}" || status=1
  echo "== $end: Hub custom code"
  (cd "$work/models" && PYTHONPATH="" HF_MODULES_CACHE="$work/modules-$end" \
    "$venv/bin/python" "$repo/scripts/version_range.py" load .) || status=1
  echo "== $end: done, ${SECONDS} s since the start; $(du -sm "$venv" | cut -f1) MB in $venv"
done
exit "$status"
