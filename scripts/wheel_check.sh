#!/usr/bin/env bash
# The package as its users meet it: build the wheel, install it into a fresh venv, and from an empty
# directory (no clone in sight) run the built-in claims on the embedded checkpoint under -n 2, then check
# that the strict gate fails a run too small to decide. CI runs this after the test suite.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip wheel -q --no-deps -w "$work/dist" "$repo"
wheel="$(ls "$work"/dist/pytest_kvaudit-*.whl)"
"$work/venv/bin/python" -m pip install -q torch==2.13.0 "${wheel}[xdist]"
mkdir "$work/empty" && cd "$work/empty"
py="$work/venv/bin/python"
"$py" -c "import pytest_kvaudit, pathlib; p = pathlib.Path(pytest_kvaudit.__file__).parent; \
assert (p / 'suites' / 'test_donor_following.py').is_file() and (p / 'embedded' / 'model.safetensors').is_file(), p"

echo "== pytest --kvaudit-model=embedded -n 2 --kvaudit-n=24 (from an empty directory, the installed wheel)"
"$py" -m pytest --kvaudit-model=embedded -n 2 --kvaudit-n=24 --kvaudit-report=report.json -p no:cacheprovider \
  | tee run.txt
grep -q "kvaudit: items done bf16 24/24, fp32 24/24" run.txt
# the plan prices the run on the ledger the wheel ships (exact where the environment matches the recording)
grep -q "plan vs actual: ran [0-9]* forward tokens, predicted [0-9]* from the ledger .*embedded_snapshots" run.txt
"$py" - <<'PY'
import json
r = json.load(open("report.json"))
names = {"replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "ledger_audit",
         "donor_following"}
assert set(r["claims"]) == names, sorted(r["claims"])
assert r["claims"]["replica_exactness"]["status"] == "pass" and r["claims"]["bridge_bitexact"]["status"] == "pass"
print("wheel run: every built-in claim judged once:", {k: v["status"] for k, v in sorted(r["claims"].items())})
PY

echo "== pytest --kvaudit-model=embedded --kvaudit-strict --kvaudit-n=3 must fail, naming the inconclusive claims"
set +e
"$py" -m pytest --kvaudit-model=embedded --kvaudit-strict --kvaudit-n=3 -q -p no:cacheprovider > strict.txt 2>&1
rc=$?
set -e
tail -n 15 strict.txt
[ "$rc" -eq 1 ] || { echo "expected exit 1 from the strict gate, got $rc"; exit 1; }
grep -q "matched_construction inconclusive under --kvaudit-strict" strict.txt
echo "wheel check passed"
