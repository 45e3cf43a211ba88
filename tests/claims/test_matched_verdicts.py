"""matched_construction and fixed_prefix_2x2 judged on built records: the verdicts the new rules give on the
tables that broke the old ones (SmolLM2's 4:0, a model that answers nothing, zero discordance at 20 items, an
FP32 rate at half the limit) and the paper's own counts; no model."""

from __future__ import annotations

import pytest

from pytest_kvaudit.claims import get
from pytest_kvaudit.claims.base import ClaimResult, Evidence
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.records import CellRecord, Continuation


def cont(label: bool, suffix: tuple[int, ...] = (1,)) -> Continuation:
    return Continuation(suffix=suffix, state_fp="s", logits_fp="l", answer="1" if label else "0", label=label)


def table(both: int, live_only: int, prefill_only: int, neither: int, dtype: str = "bf16") -> list[CellRecord]:
    """Paired records with these label counts; a label disagreement comes with a divergent suffix."""
    rows = []
    for i, (lv, pf) in enumerate([(True, True)] * both + [(True, False)] * live_only + [(False, True)] * prefill_only
                                 + [(False, False)] * neither):
        rows.append(CellRecord(item_id=f"t{i:03d}", dtype=dtype, prompt_ids=(1,), generated=(2,), boundary=1,
                               reason=None, answer="1",
                               constructions={"live": cont(lv, (1,)), "prefill": cont(pf, (1,) if lv == pf else (2,))}))
    return rows


def judge(records: list[CellRecord], dtypes: tuple[str, ...] = ("bf16",)) -> ClaimResult:
    claim = get("matched_construction")
    config = AuditConfig(dtypes=dtypes)
    return claim.judge(Evidence(records, claim.resolve(config), config))


def test_smollm2s_4_to_0_table_is_not_a_fail() -> None:
    # SmolLM2-135M bf16, 197 items: 123 right live, 119 right with prefill, 4:0 discordant
    r = judge(table(119, 4, 0, 74))
    f = r.figures
    assert r.status == "pass" and f["mcnemar_p"]["bf16"] == 0.125
    lo, hi = f["accuracy_diff_ci"]["bf16"]
    assert (round(lo * 100, 2), round(hi * 100, 2)) == (0.08, 5.10)
    assert f["accuracy_diff_ci_bootstrap"]["bf16"][0] > 0  # the old rule's interval excluded 0: a FAIL then
    assert 0 < f["power_at_margin"]["bf16"] < 1 and f["pass_chance_at_zero"]["bf16"] is not None
    assert "exact McNemar p = 0.125" in r.reason and "Tango 95% CI" in r.reason


def test_the_papers_counts_give_its_verdict() -> None:
    r = judge(table(100, 11, 9, 80))  # 200 items, accuracy +1 point; its bootstrap CI was [-3.5, +5.5]
    assert r.status == "pass"
    lo, hi = r.figures["accuracy_diff_ci_bootstrap"]["bf16"]
    assert (round(lo, 3), round(hi, 3)) == (-0.035, 0.055)
    assert r.figures["mcnemar_p"]["bf16"] == pytest.approx(0.8238, abs=1e-4)


@pytest.mark.parametrize("counts", [(0, 0, 0, 200), (200, 0, 0, 0), (5, 0, 0, 195), (195, 0, 0, 5)],
                         ids=["all-wrong", "all-right", "five-right", "five-wrong"])
def test_a_model_whose_labels_cannot_move_is_inconclusive(counts: tuple[int, int, int, int]) -> None:
    r = judge(table(*counts))
    assert r.status == "inconclusive" and "labels cannot move" in r.reason


def test_a_real_move_fails_and_too_little_evidence_is_inconclusive() -> None:
    assert judge(table(100, 15, 0, 85)).status == "fail"  # p = 6e-5
    moved = judge(table(150, 6, 0, 144))  # p = 0.031 of 300: a move, inside the margin, still fails
    assert moved.status == "fail" and moved.figures["accuracy_diff_ci"]["bf16"][1] < 0.06
    few = judge(table(10, 0, 0, 10))  # nothing discordant at 20 items: compatible with 16% discordance
    assert few.status == "inconclusive" and "80% chance to pass needs 61" in few.reason
    assert few.figures["accuracy_diff_ci"]["bf16"][1] == pytest.approx(0.1611, abs=1e-4)


def fixed_table(k: int, n: int) -> list[CellRecord]:
    rows = []
    for i in range(n):
        for d in ("bf16", "fp32"):
            rec = table(1, 0, 0, 0, d)[0]
            rec.item_id = f"t{i:03d}"
            rec.fixed = {"replay": cont(True), "prefill": cont(True, (2,) if d == "fp32" and i < k else (1,))}
            rec.fixed_prefix_fp = rec.prefix_fp
            rows.append(rec)
    return rows


@pytest.mark.parametrize("k,n,status", [(0, 200, "pass"), (2, 100, "inconclusive"), (2, 27, "inconclusive"),
                                        (9, 100, "fail"), (0, 100, "inconclusive")])
def test_the_fp32_rule_is_symmetric(k: int, n: int, status: str) -> None:
    claim = get("fixed_prefix_2x2")
    config = AuditConfig(dtypes=("bf16", "fp32"))
    r = claim.judge(Evidence(fixed_table(k, n), claim.resolve(config), config))
    hi_status = "pass" if "fp32: " in r.reason and "<=" in r.reason.split("fp32: ")[1] else (
        "fail" if "lower bound" in r.reason.split("fp32: ")[1] and "> 2%" in r.reason.split("fp32: ")[1]
        else "inconclusive")
    assert hi_status == status, r.reason
    assert "one-sided 97.5%" in r.reason
    assert r.figures["disagreement_lower"]["fp32"] <= k / n <= r.figures["disagreement_upper"]["fp32"]
