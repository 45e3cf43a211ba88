#!/usr/bin/env bash
# The GPU paths on a lent GPU machine with no network: the embedded suite on CUDA with four xdist workers
# sharing one GPU (bf16 and fp32, all 200 items), and 1 vs 2 vs 4 workers per GPU side by side.
#
#   bash benchmarks/gpu_check.sh OUT_DIR      # wheels the machine lacks in .whl/ (syrupy)
#
# kvaudit is not installed there: the plugin is loaded with PYTEST_PLUGINS and found on PYTHONPATH.
set -u
out="${1:-/tmp/kvaudit-gpu}"
mkdir -p "$out"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
# pytest-benchmark, where the image has it, warns under xdist and the project turns warnings into errors
export PYTHONPATH="/tmp/site:$PWD" PYTEST_PLUGINS=pytest_kvaudit.plugin PYTHONUNBUFFERED=1 PYTEST_ADDOPTS="-p no:benchmark"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$out/gpu.txt"
t0=$(date +%s)
timeout 330 python3 -m pytest suites -p no:cacheprovider -n 4 --kvaudit-report="$out/embedded-cuda.json" -q \
  -W ignore::DeprecationWarning 2>&1 | tail -40 | tee "$out/embedded.log"
echo "embedded suite: $(( $(date +%s) - t0 ))s" | tee -a "$out/gpu.txt"
t0=$(date +%s)
timeout 200 python3 benchmarks/workers_per_gpu.py --n 48 --workers 1,2,4 --out "$out/workers_per_gpu.json" 2>&1 \
  | tail -25 | tee "$out/workers_per_gpu.log"
echo "workers_per_gpu: $(( $(date +%s) - t0 ))s" | tee -a "$out/gpu.txt"
