"""A real pretrained model through the plugin, as a user runs it: SmolLM2-135M-Instruct (converted from its
GGUF), the built-in set builtin:arith-v2 (named: a chat checkpoint's default is v3 now) through the chat template
(the bare flag, which still means on), the claims a few units can
decide. What it pins is the paper's exactness on a real checkpoint: replicas bit-identical, the
teacher-forced bridge equal to the live cache, and no FP32 disagreement between live and prefill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

#: a few units, short suffixes: about 3 minutes on a 2-core CPU (both precisions, three claims). The first three
#: items are the kinds whose boundary SmolLM2 reaches within 11 tokens (the word problem takes 20-50)
ITEMS, MAX_NEW_TOKENS = 3, 16
CLAIMS = ("replica_exactness", "bridge_bitexact", "fixed_prefix_2x2")
#: bars three units can clear: the FP32 one-sided 97.5% Clopper-Pearson upper bound at 0/3 is 0.71
BARS = """
[pytest]
kvaudit_thresholds =
    replica_exactness.min_units=3
    bridge_bitexact.min_units=3
    fixed_prefix_2x2.max_rate=0.75
    fixed_prefix_2x2.min_recurring=1
"""


def test_a_short_audit_of_smollm2(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                  smollm2: tuple[Path, Path]) -> None:
    _, ckpt = smollm2
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # the built-in claims join, as in a user's run
    pytester.makeini(BARS)
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess(
        f"--kvaudit-model={ckpt}", "--kvaudit-chat-template", "--kvaudit-items=builtin:arith-v2",
                                        f"--kvaudit-n={ITEMS}",
        f"--kvaudit-max-new-tokens={MAX_NEW_TOKENS}", "--kvaudit-dtypes=bf16,fp32",
                                        f"--kvaudit-claims={','.join(CLAIMS)}",
        f"--kvaudit-report={report}", "-p", "no:cacheprovider", "-W", "ignore")
    data = json.loads(report.read_text())
    claims = data["claims"]
    assert data["items"]["set"] == "builtin:arith-v2" and data["items"]["total"] == ITEMS
    assert data["items"]["eligible"] == ITEMS, data["items"]
    assert data["model"]["architecture"] == "LlamaForCausalLM" and data["model"]["num_layers"] == 30
    assert {k: v["status"] for k, v in claims.items()} == dict.fromkeys(CLAIMS, "pass"), res.stdout.str()
    assert claims["replica_exactness"]["k"] == claims["replica_exactness"]["n"] >= ITEMS
    assert claims["bridge_bitexact"]["k"] == claims["bridge_bitexact"]["n"] >= ITEMS
    fp32 = claims["fixed_prefix_2x2"]["figures"]["disagreements"]["fp32"]
    assert fp32 in (0, [0, ITEMS]) or (isinstance(fp32, dict) and fp32.get("k", fp32.get("count")) == 0), fp32
    res.assert_outcomes(passed=len(CLAIMS))
