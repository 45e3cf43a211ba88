#!/usr/bin/env bash
# the 200-item SmolLM2 audit with every built-in claim, -n 2, from an empty directory
. /work/main/.venv/bin/activate
M=~/.cache/kvaudit/smollm2/SmolLM2-135M-Instruct-fp32
R=/work/main/benchmarks/results/smollm2-v3
cd /tmp/run200
start=$(date +%s)
uptime
pytest -p no:cacheprovider --rootdir=/tmp/run200 /work/main/suites --kvaudit-model=$M --kvaudit-n=200 -n 2 --snapshot-update \
  --kvaudit-snapshots=$R/snapshots --kvaudit-report=$R/report.json --kvaudit-html=$R/report.html
rc=$?
echo "exit $rc, wall $(( $(date +%s) - start )) s"
uptime
