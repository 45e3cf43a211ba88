#!/usr/bin/env bash
# The 200-item SmolLM2 audit with every built-in claim, -n 2, from an empty directory; the replicas and the bridge
# on the first 50 items (--kvaudit-exact-items=50: 200 replica pairs and 100 bridge units, each claim needs 12).
# Usage, in the venv of README's "Reproduce the paper's table":  bash benchmarks/results/smollm2-v3/run.sh OUT_DIR
# OUT_DIR gets report.json, report.html and the recorded ledger (snapshots/); N: items (default 200); SMOLLM2_DIR:
# the checkpoint folder (default: what scripts/smollm2.py prints); PY: the python (default: the active venv's).
N_DEFAULT=200
. "$(dirname "$0")/../out_dir.sh"
M="${SMOLLM2_DIR:-$("$PY" "$KV/scripts/smollm2.py")}"
W="$(mktemp -d)" && cd "$W"
start=$(date +%s)
uptime
rc=0
"$PY" -m pytest -p no:cacheprovider --rootdir="$W" "$KV/suites" --kvaudit-model="$M" --kvaudit-n="${N:-$N_DEFAULT}" \
  -n 2 --kvaudit-exact-items=50 --snapshot-update \
  --kvaudit-snapshots="$OUT/snapshots" --kvaudit-report="$OUT/report.json" --kvaudit-html="$OUT/report.html" || rc=$?
echo "exit $rc, wall $(( $(date +%s) - start )) s"
uptime
exit $rc
