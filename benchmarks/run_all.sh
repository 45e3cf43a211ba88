#!/usr/bin/env bash
# Run every benchmark with its CPU defaults (1 torch thread, small sizes): about 15 minutes on 2 idle cores.
#
#   bash benchmarks/run_all.sh                 # print the tables
#   OUT_DIR=/tmp/kvaudit-bench bash benchmarks/run_all.sh   # also write one JSON per benchmark there
#
# A missed target is printed (MISSED, with the measured figure); it does not fail the script. A
# benchmark that crashes does (set -e).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
OUT_DIR="${OUT_DIR:-}"
start=$(date +%s)
summary=()
for b in work_efficiency decode_overhead fingerprint_speed growth xdist_speedup; do
  echo "=================== $b ==================="
  args=(--device cpu)
  if [ -n "$OUT_DIR" ]; then args+=(--out "$OUT_DIR/$b.json"); fi
  t0=$(date +%s)
  "$PY" "benchmarks/$b.py" "${args[@]}"
  summary+=("$b $(( $(date +%s) - t0 ))s")
  echo
done
echo "=================== wall time ==================="
printf '%s\n' "${summary[@]}"
echo "total $(( $(date +%s) - start ))s (load average now: $(cut -d' ' -f1-3 /proc/loadavg))"
