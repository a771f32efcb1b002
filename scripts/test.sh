#!/usr/bin/env bash
# Installs what the tests need (see scripts/install.sh), then runs the whole suite on the CPU, offline.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=install.sh
. "$repo/scripts/install.sh"
cd "$repo"
HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python -m pytest "$@"
