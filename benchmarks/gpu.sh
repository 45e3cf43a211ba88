#!/usr/bin/env bash
# The benchmarks on a GPU runner: caches and models on cuda, a random ~1B-parameter Llama (TinyLlama's
# shape: hidden 2048, 22 layers, built with AutoModelForCausalLM.from_config). Budget: under 5 minutes
# on one datacenter GPU.
#
#   bash benchmarks/gpu.sh                                   # print the tables
#   OUT_DIR=/tmp/kvaudit-gpu bash benchmarks/gpu.sh          # also write one JSON per benchmark
#   DEVICE=cpu PRESET=smoke FP_SEQ=256 bash benchmarks/gpu.sh    # smoke-test the script's paths on a CPU
#
# The store benchmarks (work_efficiency, growth) run on a checkpoint folder: the random Llama is written
# once (bf16 safetensors, kvaudit's char tokenizer, 32 items, boundary tokens:4, 24 new tokens) to
# $CKPT (default: a temp dir removed at exit). The layer sweep is limited to one unit (--sweep-units 1):
# on a 22-layer model it is ~130 transplant continuations per unit.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
DEVICE="${DEVICE:-cuda}"
PRESET="${PRESET:-1b}"
FP_SEQ="${FP_SEQ:-4096}"           # fingerprint cache: 24 layers x K,V (1, 8, FP_SEQ, 128) bf16 (384 MiB)
OUT_DIR="${OUT_DIR:-}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
CKPT="${CKPT:-$tmp/llama-$PRESET}"

out() { if [ -n "$OUT_DIR" ]; then echo "--out $OUT_DIR/$1.json"; fi; }
start=$(date +%s)
summary=()
step() {  # step NAME CMD...: run, time, remember
  local name="$1"; shift
  echo "=================== $name ==================="
  local t0; t0=$(date +%s)
  "$@"
  summary+=("$name $(( $(date +%s) - t0 ))s")
  echo
}

"$PY" -c "import torch, sys; d='$DEVICE'; sys.exit(0 if d == 'cpu' or torch.cuda.is_available() else \
'gpu.sh: DEVICE=' + d + ' but torch sees no CUDA device (torch ' + torch.__version__ + ')')"

# shellcheck disable=SC2046
step fingerprint_speed "$PY" benchmarks/fingerprint_speed.py --device "$DEVICE" --seq "$FP_SEQ" $(out fingerprint_speed)
# shellcheck disable=SC2046
step decode_overhead "$PY" benchmarks/decode_overhead.py --device "$DEVICE" --dtype bf16 --tokens 64 --repeats 11 \
  --llama-preset "$PRESET" --llama-prompt 128 --llama-tokens 64 --llama-repeats 5 $(out decode_overhead)
step checkpoint "$PY" benchmarks/_common.py "$CKPT" --preset "$PRESET" --device "$DEVICE" --n-items 32
# shellcheck disable=SC2046
step work_efficiency "$PY" benchmarks/work_efficiency.py --device "$DEVICE" --model "$CKPT" --n 8 \
  --dtypes bf16,fp32 --sweep-units 1 $(out work_efficiency)
# shellcheck disable=SC2046
step growth "$PY" benchmarks/growth.py --device "$DEVICE" --model "$CKPT" --items 4,8,16 --dtypes fp32 \
  --suffix-model "$CKPT" --suffix-items 4 --suffix-repeats 1 --sweep-units 0 $(out growth)
# shellcheck disable=SC2046
step workers_per_gpu "$PY" benchmarks/workers_per_gpu.py --device "$DEVICE" --model "$CKPT" --n 16 \
  --workers 1,2,4 $(out workers_per_gpu)

echo "=================== wall time ==================="
printf '%s\n' "${summary[@]}"
echo "total $(( $(date +%s) - start ))s"
