#!/usr/bin/env bash
# GPU check, about 10 minutes on one GPU: bf16 pretraining and probes of the tiny recipe (beside an fp32 run of the
# same recipe, the reference for bf16), a few steps of the paper-sized `base` and `base_probe` recipes on a local
# corpus, the speed benchmark at base and large (tokens/s, MFU, peak memory), the loss without logits against the
# logits' loss at the GPU's shapes in pieces of each size (the piece rule's sweep), and a 2-process run. Every step's
# log, steps.tsv (name, status, seconds) and summary.json / summary.txt (the pass/fail checks of docs/BENCHMARKS.md,
# "GPU check") go to $OUT (default outputs/gpu_check). Any failing step stops the script with its log's tail.
#
#   bash benchmarks/gpu_check.sh [CORPUS_DIR]            # CORPUS_DIR holds train.txt and valid.txt (default
#                                                        # data/tiny-shakespeare, shipped with the repository)
#   GPU_CHECK_DEVICE=cpu bash benchmarks/gpu_check.sh    # the same steps on the CPU with tiny step counts (minutes):
#                                                        # checks the script itself on a machine without a GPU
#
# Python: $PYTHON, else .venv/bin/python when present, else python; torch with CUDA must be installed already (this
# script installs nothing). The base recipes read bert-base-uncased's WordPiece: $TOKENIZER (a folder with vocab.txt
# or a Hub name), else ../shared/data/tokenizers/bert-base-uncased when present, else a BPE trained on the corpus
# with contiguous blocks (a printed note says so; TOKENIZER=bpe forces it). Runs offline (HF_HUB_OFFLINE=1) unless
# TOKENIZER is a Hub name.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
data="$(cd "${1:-$repo/data/tiny-shakespeare}" && pwd)"
out="${OUT:-$repo/outputs/gpu_check}"
device="${GPU_CHECK_DEVICE:-cuda}"
py="${PYTHON:-python}"
[[ -z "${PYTHON:-}" && -x "$repo/.venv/bin/python" ]] && py="$repo/.venv/bin/python"
export HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
[[ -d "${TOKENIZER:-}" || -z "${TOKENIZER:-}" || "${TOKENIZER:-}" == bpe ]] && export HF_HUB_OFFLINE=1
mkdir -p "$out"
rm -f "$out/steps.tsv"

# Step counts: the GPU's, or the dry run's on the CPU (the same steps, each a few seconds to a minute).
case "$device" in
  cuda)
    "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device visible to torch')" \
      || { echo "GPU check: torch sees no CUDA device; run GPU_CHECK_DEVICE=cpu for the CPU dry run." >&2; exit 1; }
    device_args=()
    tiny_args=(--logging_steps 5)  # the recipes' schedules: 200 steps, then 3 probe epochs of 64 steps
    tiny_probe_args=(--logging_steps 5)
    base_args=(--max_train_steps 20 --num_warmup_steps 2 --per_device_train_batch_size 32 --gradient_accumulation_steps 1
               --max_eval_blocks 64 --per_device_eval_batch_size 32 --logging_steps 1)
    base_probe_args=("${base_args[@]}" --max_train_blocks 512)
    two_process_args=(--per_device_train_batch_size 8 --logging_steps 5)  # 2 x 8 = the recipe's 16 blocks a step
    bench_args=(--sizes base large --device cuda --precision bf16 --repeats 3 --rounds 1)
    # tokens width vocabulary: the benchmark's 64 x 128 tokens at base's and large's heads and GPT-2's, and base's at
    # 256 sequences a step
    loss_shapes=("8192 768 30528" "8192 1024 30528" "8192 768 50257" "32768 768 30528")
    loss_args=(--device cuda --precision bf16 --piece_rows 256 512 1024 2048 4096 8192 --repeats 6 --rounds 3)
    ;;
  cpu)
    device_args=(--cpu)
    tiny_args=(--max_train_steps 8 --num_warmup_steps 1 --max_eval_blocks 16 --logging_steps 1 --eval_steps 4)
    tiny_probe_args=(--max_train_steps 6 --num_warmup_steps 1 --max_train_blocks 64 --max_eval_blocks 16 --logging_steps 1
                     --eval_steps 3)
    base_args=(--max_train_steps 4 --num_warmup_steps 1 --per_device_train_batch_size 2 --gradient_accumulation_steps 1
               --max_train_blocks 16 --max_eval_blocks 4 --per_device_eval_batch_size 4 --logging_steps 1)
    base_probe_args=("${base_args[@]}")
    two_process_args=(--per_device_train_batch_size 8 "${tiny_args[@]}")
    bench_args=(--sizes tiny --vocab_size 128 --seq_len 32 --micro_batch 2 --device cpu --precision bf16 --repeats 1
                --rounds 1 --num_threads 1)
    loss_shapes=("256 16 512")
    loss_args=(--device cpu --precision bf16 --piece_rows 64 256 --repeats 1 --rounds 1 --num_threads 1)
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    ;;
  *) echo "GPU_CHECK_DEVICE must be cuda or cpu, got '$device'." >&2; exit 1 ;;
esac
corpus=(--train_file "$data/train.txt" --validation_file "$data/valid.txt")
common=(--disable_tqdm --overwrite_output_dir --preprocessing_num_workers 2 "${device_args[@]}")
train=("$py" -m twotower.training.train)

# The base recipes' tokenizer (see the header); without a BERT vocabulary, a recipe over `base` that trains a BPE.
bert="${TOKENIZER:-}"
[[ "$bert" == bpe ]] && bert=""  # TOKENIZER=bpe: the BPE path even where a BERT vocabulary is at hand
shared_bert="$repo/../shared/data/tokenizers/bert-base-uncased"
[[ -z "${TOKENIZER:-}" && -f "$shared_bert/vocab.txt" ]] && bert="$shared_bert"
if [[ -n "$bert" ]]; then
  base_recipe=(--recipe base --tokenizer_name_or_path "$bert")
  base_probe_recipe=(--recipe base_probe)
else
  echo "Note: no BERT vocabulary (set TOKENIZER); the base recipe trains a BPE of 30522 tokens, contiguous blocks."
  printf 'extends: base\ntokenizer_name_or_path: null\ntokenizer_vocab_size: 30522\nblock_format: contiguous\n' \
    > "$out/base_bpe.yaml"
  base_recipe=(--recipe "$out/base_bpe.yaml")
  base_probe_recipe=(--recipe base_probe --block_format contiguous)
fi

# step NAME COMMAND...: run COMMAND with its output in $out/NAME.log, timed; a failure stops the script.
step() {
  local name=$1 start status=0
  shift
  echo "== $name: $*"
  start=$(date +%s.%N)
  "$@" > "$out/$name.log" 2>&1 || status=$?
  local seconds
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ $status -ne 0 ]]; then
    printf '%s\tfailed (exit %s)\t%s\n' "$name" "$status" "$seconds" >> "$out/steps.tsv"
    echo "FAILED: $name (exit $status after ${seconds} s); the end of $out/$name.log:" >&2
    tail -n 40 "$out/$name.log" >&2
    exit 1
  fi
  printf '%s\tok\t%s\n' "$name" "$seconds" >> "$out/steps.tsv"
  echo "   ok in ${seconds} s"
}
skip() {  # skip NAME REASON
  printf '%s\tskipped: %s\t0\n' "$1" "$2" >> "$out/steps.tsv"
  echo "== $1: skipped: $2"
}

# 1-3. The tiny recipe: bf16 pretraining, the same in fp32 (the reference of the bf16 check), bf16 probes.
step tiny_bf16 "${train[@]}" --recipe tiny "${corpus[@]}" "${common[@]}" "${tiny_args[@]}" \
  --mixed_precision bf16 --output_dir "$out/tiny_bf16"
step tiny_fp32 "${train[@]}" --recipe tiny "${corpus[@]}" "${common[@]}" "${tiny_args[@]}" \
  --mixed_precision no --output_dir "$out/tiny_fp32"
step tiny_probe_bf16 "${train[@]}" --recipe tiny_probe "${corpus[@]}" "${common[@]}" "${tiny_probe_args[@]}" \
  --mixed_precision bf16 --pretrained_model "$out/tiny_bf16/model" --output_dir "$out/tiny_probe_bf16"

# 4-5. The paper-sized base recipes for a few steps (warm-up shortened so that the loss moves).
step base_bf16 "${train[@]}" "${base_recipe[@]}" "${corpus[@]}" "${common[@]}" "${base_args[@]}" \
  --mixed_precision bf16 --output_dir "$out/base_bf16"
step base_probe_bf16 "${train[@]}" "${base_probe_recipe[@]}" "${corpus[@]}" "${common[@]}" "${base_probe_args[@]}" \
  --mixed_precision bf16 --pretrained_model "$out/base_bf16/model" --output_dir "$out/base_probe_bf16"

# 6. The speed benchmark (docs/BENCHMARKS.md): its markdown sections in bench_speed.md, every figure in bench_speed.json.
step bench_speed "$py" -c '
import json, sys
from benchmarks.bench_speed import main
results = main(sys.argv[2:])
with open(sys.argv[1], "w") as handle:
    json.dump(results, handle, indent=1, default=lambda value: getattr(value, "__dict__", str(value)))
' "$out/bench_speed.json" "${bench_args[@]}" --output "$out/bench_speed.md"

# 7. The loss without logits against the logits' loss (docs/speed.md, the piece rule): each shape's columns in
# loss_sweep.json.
step loss_sweep "$py" -c '
import json, sys
from benchmarks.bench_linear_cross_entropy import main
from modeling_twotower.linear_cross_entropy import piece_rows
sweep = []
for shape in sys.argv[2].split(","):
    tokens, width, vocab = map(int, shape.split())
    result = main(["--tokens", str(tokens), "--hidden_size", str(width), "--vocab_size", str(vocab), *sys.argv[3:]])
    sweep.append({"tokens": tokens, "hidden_size": width, "vocab_size": vocab,
                  "rule_rows": piece_rows(tokens, width, vocab), "ms_and_peak_bytes": result})
with open(sys.argv[1], "w") as handle:
    json.dump(sweep, handle, indent=1)
' "$out/loss_sweep.json" "$(IFS=,; echo "${loss_shapes[*]}")" "${loss_args[@]}"

# 8. Two processes. NCCL refuses two ranks on one GPU, so with one GPU the 2-process run uses the CPU (gloo); with two
# or more, DDP on 2 GPUs (training/accelerate_configs/ddp.yaml). Same global batch as the 1-process tiny_bf16 run.
gpus=0
[[ "$device" == cuda ]] && gpus=$("$py" -c "import torch; print(torch.cuda.device_count())")
if (( gpus >= 2 )); then
  step two_process_bf16 "$py" -m accelerate.commands.launch --config_file training/accelerate_configs/ddp.yaml \
    --num_processes 2 -m twotower.training.train --recipe tiny "${corpus[@]}" "${common[@]}" "${two_process_args[@]}" \
    --mixed_precision bf16 --output_dir "$out/two_process_bf16"
else
  [[ "$device" == cuda ]] && skip two_process_gpu "one GPU visible; NCCL refuses two ranks on one device"
  step two_process_cpu_bf16 "$py" -m torch.distributed.run --nproc_per_node 2 -m twotower.training.train \
    --recipe tiny "${corpus[@]}" --disable_tqdm --overwrite_output_dir --cpu --per_device_train_batch_size 8 \
    --max_train_steps 8 --num_warmup_steps 1 --max_eval_blocks 16 --logging_steps 1 --eval_steps 4 \
    --mixed_precision bf16 --output_dir "$out/two_process_cpu_bf16"
fi

# 9. The checks: every loss finite and falling, bf16 within tolerance of fp32, 2 processes like 1, benchmark figures.
"$py" - "$out" "$device" <<'PYTHON'
import glob, json, math, sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

out, device = Path(sys.argv[1]), sys.argv[2]
BF16_RTOL_10_STEPS = 1e-3  # tests/training/test_bf16.py's tolerance: per-step losses of the first 10 steps
FINAL_RTOL = 0.02  # final validation losses after a whole run, where rounding differences have compounded
checks = []

def check(name, passed, detail):
    checks.append({"check": name, "passed": bool(passed), "detail": detail})

def scalars(run, tag):
    files = glob.glob(str(out / run / "runs" / "*" / "events.out.tfevents.*"))
    if not files:
        return []
    events = EventAccumulator(files[0])
    events.Reload()
    return [event.value for event in events.Scalars(tag)] if tag in events.Tags()["scalars"] else []

def eval_losses(run):
    """Validation losses: the joint model's, or in a probe run the mean of the probes' (the joint model is frozen)."""
    probes = [scalars(run, f"eval/probe_{index}_loss") for index in range(16)]
    probes = [values for values in probes if values]
    return [sum(values) / len(values) for values in zip(*probes)] if probes else scalars(run, "eval/loss")

runs = [path.parent.parent.name for path in out.glob("*/runs/eval_history.jsonl")]
losses = {run: {"train": scalars(run, "train/loss"), "eval": eval_losses(run)} for run in sorted(runs)}
for run, loss in losses.items():
    train = loss["train"]
    finite = bool(train) and all(math.isfinite(value) for value in train + loss["eval"])
    check(f"{run}: losses finite", finite, f"{len(train)} logged train losses, eval {loss['eval']}")
    check(f"{run}: train loss falls", finite and train[-1] < train[0], f"first {train[:1]}, last {train[-1:]}")

def relative(a, b):
    return abs(a - b) / abs(b)

bf16, fp32 = losses.get("tiny_bf16"), losses.get("tiny_fp32")
if bf16 and fp32:
    first = [relative(a, b) for a, b in zip(bf16["train"][:10], fp32["train"][:10])]
    check("tiny: bf16 train losses within 1e-3 of fp32 (first 10 logged)", max(first) <= BF16_RTOL_10_STEPS,
          f"max relative difference {max(first):.2e}")
    final = relative(bf16["eval"][-1], fp32["eval"][-1])
    check("tiny: bf16 final validation loss within 2% of fp32", final <= FINAL_RTOL,
          f"bf16 {bf16['eval'][-1]:.4f}, fp32 {fp32['eval'][-1]:.4f}, relative {final:.2e}")
two = losses.get("two_process_bf16")
if two and bf16:
    final = relative(two["eval"][-1], bf16["eval"][-1])
    check("2 GPUs: final validation loss within 2% of 1 GPU", final <= FINAL_RTOL,
          f"2 processes {two['eval'][-1]:.4f}, 1 process {bf16['eval'][-1]:.4f}")
bench = json.loads((out / "bench_speed.json").read_text())
figures = {}
for size, result in bench["sizes"].items():
    row = result["comparison"]["models"]["two-tower"]
    figures[size] = {"tokens_per_s": row["train"]["tokens_per_s"], "mfu": row["mfu"],
                     "peak_memory_bytes": row["train"].get("peak_memory_bytes")}
    check(f"bench {size}: two-tower training tokens/s and MFU positive", row["train"]["tokens_per_s"] > 0 and row["mfu"] > 0,
          f"{row['train']['tokens_per_s']:,.0f} tokens/s, MFU {row['mfu']:.1%}")

loss_sweep = []
for shape in json.loads((out / "loss_sweep.json").read_text()):
    ms = {name: timed[0] for name, timed in shape["ms_and_peak_bytes"].items() if name != "ratio"}
    pieces = {name: value for name, value in ms.items() if name.endswith("_rows")}
    fastest = min(pieces, key=pieces.get)
    loss_sweep.append(f"{shape['tokens']} x {shape['hidden_size']}, vocabulary {shape['vocab_size']}: logits "
                      f"{ms['with_logits']:.2f} ms, the rule's {shape['rule_rows']} rows {ms['without_logits']:.2f} ms "
                      f"({ms['with_logits'] / ms['without_logits']:.2f}x the logits' speed), fastest "
                      f"{fastest.removesuffix('_rows')} rows {pieces[fastest]:.2f} ms")

steps = [dict(zip(("step", "status", "seconds"), line.split("\t"))) for line in (out / "steps.tsv").read_text().splitlines()]
summary = {"device": device, "machine": bench["machine"], "steps": steps, "checks": checks, "benchmark": figures,
           "loss_sweep": loss_sweep, "losses": losses}
(out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
lines = [f"GPU check on {device}: {bench['machine']}", "", "steps:"]
lines += [f"  {s['step']:<22} {s['status']:<12} {s['seconds']} s" for s in steps]
lines += ["", "checks:"] + [f"  {'PASS' if c['passed'] else 'FAIL'}  {c['check']}: {c['detail']}" for c in checks]
lines += ["", "benchmark (two-tower training):"]
lines += [f"  {size}: {f['tokens_per_s']:,.0f} tokens/s, MFU {f['mfu']:.1%}" for size, f in figures.items()]
lines += ["", "loss without logits against the logits' loss (forward and backward):"]
lines += [f"  {line}" for line in loss_sweep]
(out / "summary.txt").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
failed = [c["check"] for c in checks if not c["passed"]]
sys.exit(f"GPU check: {len(failed)} check(s) failed: {failed}" if failed else 0)
PYTHON
echo "GPU check passed; logs and summary in $out"
