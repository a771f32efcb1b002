#!/usr/bin/env bash
# The main job on a fresh machine: install (see scripts/install.sh), then the tiny recipe on a local corpus:
# pretrain the joint two-tower model, train four probe replicas per tower, and score tower preference on the
# validation text. Usage: bash scripts/train_tiny.sh [CORPUS_DIR] [OUTPUT_DIR], where CORPUS_DIR holds train.txt
# and valid.txt (default: data/tiny-shakespeare, shipped with the repository; e.g. ../shared/data/wikitext-2).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="$(cd "${1:-$repo/data/tiny-shakespeare}" && pwd)"
out="${2:-$repo/outputs/tiny}"
# shellcheck source=install.sh
. "$repo/scripts/install.sh"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
corpus=(--train_file "$data/train.txt" --validation_file "$data/valid.txt")
# Running the script again continues an interrupted phase from its newest checkpoint and leaves a finished one as
# it is; a phase that saved no checkpoint starts over.
continuation() {
  if compgen -G "$1/checkpoints/*" > /dev/null; then echo --resume_from_checkpoint latest; else echo --overwrite_output_dir; fi
}

python -m twotower.training.train --recipe tiny --output_dir "$out/pretrain" "${corpus[@]}" $(continuation "$out/pretrain")
python -m twotower.training.train --recipe tiny_probe --output_dir "$out/probe" \
  --pretrained_model "$out/pretrain/model" "${corpus[@]}" $(continuation "$out/probe")
python -m twotower.evaluation.scoring.score --model_dir "$out/probe/model" --output_dir "$out/report" \
  --validation_file "$data/valid.txt"
echo "Model with trained probes: $out/probe/model"
echo "Preference report:         $out/report/report.md"
