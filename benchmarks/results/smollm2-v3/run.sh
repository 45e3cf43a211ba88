#!/usr/bin/env bash
# the 200-item SmolLM2 audit with every built-in claim, -n 2, from an empty directory; the replicas and the bridge
# on the first 50 items (--kvaudit-exact-items=50: 200 replica pairs and 100 bridge units, each claim needs 12)
# KV: the checkout to run (default: this one); R: where the results go
. /work/main/.venv/bin/activate
KV=${KV:-/work/main}
M=~/.cache/kvaudit/smollm2/SmolLM2-135M-Instruct-fp32
R=${R:-$KV/benchmarks/results/smollm2-v3}
mkdir -p /tmp/run200 && cd /tmp/run200
start=$(date +%s)
uptime
PYTHONPATH=$KV pytest -p no:cacheprovider --rootdir=/tmp/run200 $KV/suites --kvaudit-model=$M --kvaudit-n=200 -n 2 \
  --kvaudit-exact-items=50 --snapshot-update \
  --kvaudit-snapshots=$R/snapshots --kvaudit-report=$R/report.json --kvaudit-html=$R/report.html
rc=$?
echo "exit $rc, wall $(( $(date +%s) - start )) s"
uptime
