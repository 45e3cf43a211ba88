#!/usr/bin/env bash
# The transformers versions kvaudit supports, oldest and newest of the declared range, each in a fresh
# venv with the CPU torch, running the core self-tests (cache adapter properties, the plugin end to end,
# the ledger, chat templates). Usage: bash scripts/matrix.sh [VERSION ...]   (default: the range's ends)
# TESTS="tests/core/runtime/test_chat.py ..." runs those test files instead of the default list.
set -euo pipefail
cd "$(dirname "$0")/.."
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=("4.57.*" "5.*")
for v in "${versions[@]}"; do
  env_dir=".matrix/transformers-${v//[*]/x}"
  python3 -m venv "$env_dir"
  "$env_dir/bin/pip" install -q torch==2.13.0 "transformers==$v" -e '.[dev]'
  echo "== transformers $("$env_dir/bin/python" -c 'import transformers; print(transformers.__version__)')"
  # shellcheck disable=SC2086  # TESTS is a space-separated list of paths
  "$env_dir/bin/pytest" -q -p no:cacheprovider ${TESTS:-tests/core/runtime/test_cache_properties.py tests/plugin/test_plugin.py tests/core/runtime/test_chat.py} \
    -k "not xdist and not crashed" -x
done
