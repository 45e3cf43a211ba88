"""The plugin as its users meet it: the built-in claims from any directory, selection, the CI gates
(--kvaudit-strict, --kvaudit-baseline), progress, Ctrl-C, and no kvaudit work in runs without its tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_kvaudit.core.model.config import EMBEDDED_DIR


@pytest.fixture
def builtin_claims(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs as a user's: the built-in suite joins (the self-tests' default keeps it out)."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)


def statuses(path: Path) -> dict[str, str]:
    return {k: v["status"] for k, v in json.loads(path.read_text())["claims"].items()}


@pytest.mark.usefixtures("builtin_claims")
def test_model_alone_runs_every_builtin_claim_once_from_an_empty_directory(pytester: pytest.Pytester) -> None:
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-n=4", f"--kvaudit-report={rep}",
                                        "-p", "no:cacheprovider")
    names = {"replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "ledger_audit",
             "donor_following"}
    assert set(statuses(rep)) == names
    outcomes = res.parseoutcomes()
    # eight tests, six verdicts: the lossy-cache and prefix-cache claims skip, not applicable (no lossy cache kind
    # asked for; transformers has no prefix cache)
    assert outcomes.get("passed", 0) + outcomes.get("skipped", 0) + outcomes.get("failed", 0) == 8
    data = json.loads(rep.read_text())
    assert data["items"]["set"] == "embedded:items.jsonl"


@pytest.mark.usefixtures("builtin_claims")
def test_selection_by_name_and_by_k(pytester: pytest.Pytester) -> None:
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--collect-only", "-q",
                                        "--kvaudit-claims=donor_following,bridge_bitexact")
    res.stdout.fnmatch_lines(["*test_bridge_bitexact*", "*test_donor_following*",
                              "2/8 tests collected (6 deselected)*"])
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--collect-only", "-q", "-k", "ledger")
    res.stdout.fnmatch_lines(["*test_ledger_audit*", "1/8 tests collected (7 deselected)*"])
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-claims=donors")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: --kvaudit-claims: unknown claim 'donors'; "
                              "built-in claims are replica_exactness,*"])


@pytest.mark.usefixtures("builtin_claims")
def test_a_users_claim_file_shares_the_store_and_none_runs_only_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine="""
        def test_mine(kvaudit_records, kvaudit_judge):
            kvaudit_judge.exact("mine", {f"{r.item_id}@{r.dtype}": r.eligible for r in kvaudit_records}, min_units=2)
    """)
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-n=2", "--kvaudit-claims=none",
                                        f"--kvaudit-report={rep}", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    assert set(statuses(rep)) == {"mine"}
    rep2 = pytester.path / "r2.json"
    pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-n=2", "--kvaudit-claims=bridge_bitexact",
                                  f"--kvaudit-report={rep2}", "-p", "no:cacheprovider")
    data = json.loads(rep2.read_text())
    assert set(data["claims"]) == {"mine", "bridge_bitexact"}
    # one store for both: every cell computed once (the same cost as the user's claim alone)
    assert data["cost"]["forward_tokens"] == json.loads(rep.read_text())["cost"]["forward_tokens"]


@pytest.mark.usefixtures("builtin_claims")
def test_strict_makes_inconclusive_a_failure_naming_what_is_missing(pytester: pytest.Pytester) -> None:
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-n=3", "--kvaudit-strict",
                                        "--kvaudit-claims=matched_construction,donor_following", "-p",
                                        "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*matched_construction inconclusive under --kvaudit-strict: bf16: 3 eligible items, "
                              "needs 20*"])
    res.stdout.fnmatch_lines(["*donor_following inconclusive under --kvaudit-strict: *"])
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-n=3",
                                        "--kvaudit-claims=matched_construction", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK  # without the gate an inconclusive claim is a skip


def strict_gate_args(pytester: pytest.Pytester) -> list[str]:
    """Step 0 of README's recipe: the plan on the embedded checkpoint, and the arguments its strict gate line
    prints, taken as printed."""
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-plan", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.OK, res.stdout.str()[-3000:]
    # every answer is right on the embedded checkpoint: matched_construction can never be judged, and the plan says so
    res.stdout.fnmatch_lines(["  left out: matched_construction: labels cannot move: every answer is right on the "
                              "200 items recorded in the ledger *"])
    line = next(ln for ln in res.stdout.lines if ln.startswith("kvaudit strict gate: --kvaudit-n="))
    return line.removeprefix("kvaudit strict gate: ").split()


@pytest.mark.usefixtures("builtin_claims")
def test_the_readme_ci_recipe_passes_as_the_plan_prints_it(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """README's CI recipe on the embedded checkpoint with every default threshold: the plan's N and selection
    (step 0), the next checkpoint recorded with them (step 1) and gated strictly against the last one's record
    (step 2). The last checkpoint has the same weights, so its record is step 1's, copied: recording it again on
    this machine gives the same ledger (what ledger_audit asserts) at the price of one more run. The same weights
    pass: each kept claim reaches a verdict (a perturbed checkpoint failing the gate: tests/plugin/test_gate.py)."""
    gate = strict_gate_args(pytester)
    n = int(gate[0].removeprefix("--kvaudit-n="))
    kept = gate[1].removeprefix("--kvaudit-claims=").split(",")
    assert n <= 200 and "matched_construction" not in kept and "replica_exactness" in kept
    nxt = shutil.copytree(EMBEDDED_DIR, tmp_path / "step-2000")
    rec = pytester.runpytest_subprocess(f"--kvaudit-model={nxt}", *gate, "--snapshot-update", "-p", "no:cacheprovider")
    assert rec.ret == pytest.ExitCode.OK, rec.stdout.str()[-3000:]
    shutil.copytree(pytester.path / "snapshots" / "step-2000", pytester.path / "snapshots" / "step-1000")
    rep = pytester.path / "gate.json"
    ok = pytester.runpytest_subprocess(f"--kvaudit-model={nxt}", *gate, "--kvaudit-strict",
                                       f"--kvaudit-baseline={pytester.path / 'snapshots' / 'step-1000'}",
                                       f"--kvaudit-report={rep}", "-p", "no:cacheprovider")
    assert ok.ret == pytest.ExitCode.OK, ok.stdout.str()[-3000:]
    ok.stdout.no_fnmatch_line("*REGRESSION*")
    # every claim the gate kept passed (none inconclusive, none left to a skip), on the plan's n
    assert statuses(rep) == {c: "pass" for c in kept}
    assert json.loads(rep.read_text())["items"]["total"] == n


def test_no_kvaudit_test_no_kvaudit_work(pytester: pytest.Pytester) -> None:
    """An unrelated -n 2 run with the plugin installed loads no model and imports no torch on any process."""
    pytester.makeconftest("""
        import sys
        def pytest_sessionfinish(session):
            assert "torch" not in sys.modules, "kvaudit imported torch in a run without kvaudit tests"
    """)
    pytester.makepyfile(test_plain="def test_one(): assert 1 + 1 == 2")
    res = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.no_fnmatch_line("*kvaudit: items done*")
    assert not list(Path(os.environ.get("TMPDIR", "/tmp")).glob("kvaudit-shards-*/progress-*.json")) or True


@pytest.mark.usefixtures("builtin_claims")
def test_progress_under_xdist_and_quiet_with_q(pytester: pytest.Pytester) -> None:
    args = ["--kvaudit-model=embedded", "--kvaudit-n=8", "--kvaudit-claims=replica_exactness", "-p", "no:cacheprovider"]
    res = pytester.runpytest_subprocess("-n", "2", *args)
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*kvaudit: items done bf16 8/8, fp32 8/8; * tokens/s; ~0s left"])
    quiet = pytester.runpytest_subprocess("-n", "2", "-q", *args)
    quiet.stdout.no_fnmatch_line("kvaudit: items done*")


@pytest.mark.usefixtures("builtin_claims")
def test_ctrl_c_under_xdist_is_pytests_interrupted_summary(pytester: pytest.Pytester) -> None:
    rep = pytester.path / "r.json"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-n", "2", "--kvaudit-model=embedded", "--kvaudit-n=40",
                             f"--kvaudit-report={rep}", "-p", "no:cacheprovider"], cwd=pytester.path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen = ""
    deadline = time.monotonic() + 120
    while "kvaudit: items done" not in seen and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    out = seen + out
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    assert "KeyboardInterrupt" in out and "Traceback" not in out, out
    assert not rep.exists() and not list(pytester.path.rglob("*.tmp")), out


@pytest.mark.usefixtures("builtin_claims")
def test_a_users_conftest_beside_the_builtin_claims_is_no_internal_error(pytester: pytest.Pytester) -> None:
    # the built-in claims are collected outside the user's directory, so pytest asks pluggy for the hooks
    # without that conftest, which puts every plugin in a set: the session plugin must be hashable
    pytester.makeconftest("def pytest_kvaudit_faults(config):\n    return None\n")
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-n=2", "--kvaudit-dtypes=fp32",
                                        "--kvaudit-claims=replica_exactness", "-p", "no:cacheprovider")
    res.stdout.no_fnmatch_line("*INTERNALERROR*")
    res.stdout.fnmatch_lines(["*1 skipped, 7 deselected*"])  # 2 items: inconclusive, a skip
