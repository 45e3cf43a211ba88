# Sourced by the results scripts (benchmarks/results/*/run.sh): the folder their results go to, given as the first
# argument. A script's own folder holds the committed results, so it is refused unless OVERWRITE=1 says to replace
# them. Sets OUT (absolute), KV (the checkout) and PY (the python of the venv that is active: the script takes the
# venv from the environment, PY=... names another).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)"
KV="$(cd "$here/../../.." && pwd)"
PY="${PY:-python}"
if [ $# -lt 1 ]; then
  echo "usage: bash ${here#"$KV"/}/run.sh OUT_DIR   (OUT_DIR: where the results go; N=items, default ${N_DEFAULT})" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
if [ "$OUT" = "$here" ] && [ "${OVERWRITE:-0}" != 1 ]; then
  echo "refusing to overwrite the committed results in ${here#"$KV"/}: give another folder, or OVERWRITE=1" >&2
  exit 2
fi
