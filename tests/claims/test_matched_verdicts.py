"""matched_construction and fixed_prefix_2x2 judged on built records: the verdicts today's rules (issue 45's
equivalence form, exact rate bounds) give on the tables that broke earlier ones (SmolLM2's 4:0, a model that
answers nothing, zero discordance at 20 items, an FP32 rate at half the limit) and the paper's own counts; no
model."""

from __future__ import annotations

import math

import pytest

from pytest_kvaudit.claims import get
from pytest_kvaudit.claims.base import ClaimResult, Evidence
from pytest_kvaudit.claims.rules import matched_rule, matched_zs
from pytest_kvaudit.claims.stats import tango_interval
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


def test_smollm2s_4_to_0_table_moved_less_than_the_margin() -> None:
    # SmolLM2-135M bf16, 197 items: 123 right live, 119 right with prefill, 4:0 discordant
    r = judge(table(119, 4, 0, 74))
    f = r.figures
    lo, hi = f["accuracy_diff_ci"]["bf16"]
    assert (lo, hi) == tango_interval(4, 0, 197, z=matched_zs(0.06)[0])
    assert r.status == "pass" and 0 < lo and hi < 0.06 and f["excludes_zero"]["bf16"]  # moved, by less than 6
    assert f["mcnemar_p"]["bf16"] == 0.125 and f["verdict"]["bf16"] == "pass"
    assert f["accuracy_diff_ci_bootstrap"]["bf16"][0] > 0  # the paper's interval excluded 0: a FAIL under rules 1
    # these records diverge only where labels differ: both chances at 4/197, labelled as observed
    assert f["pass_chance_at_zero"]["bf16"] == f["pass_chance_at_divergence"]["bf16"] > 0.9
    assert "power_at_margin" not in f  # a chance at a floor of the discordance: gone (issue 45)
    assert ("bf16: accuracy moved less than 6 points (95%): moved +2.0 points (exact McNemar p = 0.125), 4:0 "
            "discordant labels, Tango interval [+0.1, +5.1] excludes 0, within ±6") in r.reason
    assert "at the observed label discordance 2.0%" in r.reason


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


def test_a_move_beyond_the_margin_fails_and_one_inside_it_passes() -> None:
    assert judge(table(100, 40, 0, 60)).status == "fail"  # 20 points: the interval lies wholly outside ±6
    near = judge(table(100, 15, 0, 85))  # 7.5 points: the interval straddles +6, neither shown
    assert near.status == "inconclusive" and "not shown within ±6" in near.reason
    inside = judge(table(150, 6, 0, 144))  # p = 0.031 of 300: a move, and within the margin
    assert inside.status == "pass" and inside.figures["mcnemar_p"]["bf16"] < 0.05
    few = judge(table(10, 0, 0, 10))  # nothing discordant at 20 items: compatible with 16% discordance
    z = matched_zs(0.06)[0]
    assert few.status == "inconclusive" and f"80% chance to pass needs {math.ceil(z * z * 0.94 / 0.06)}" in few.reason
    assert few.figures["accuracy_diff_ci"]["bf16"][1] == pytest.approx(z * z / (20 + z * z), abs=1e-9)


def test_the_fail_alpha_is_split_over_the_precisions() -> None:
    # a table the one-precision FAIL level fails and the two-precision level does not: the claim's FAIL size
    # stays at most alpha whatever the number of precisions
    b = next(b for b in range(200) if matched_rule(b, 0, 200, 0.06, 0.95, 1)[1] and not matched_rule(b, 0, 200, 0.06,
                                                                                                     0.95, 2)[1])
    one = judge(table(100 - b, b, 0, 100))
    two = judge(table(100 - b, b, 0, 100) + table(100, 0, 0, 100, "fp32"), ("bf16", "fp32"))
    assert one.status == "fail" and two.figures["verdict"]["bf16"] == "inconclusive"
    assert two.figures["tango_z"]["verdicts"] == 2 and two.figures["tango_z"]["fail"] > one.figures["tango_z"]["fail"]


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


@pytest.mark.parametrize("k,n,status", [(0, 200, "pass"), (0, 183, "pass"), (0, 182, "inconclusive"),
                                        (2, 100, "inconclusive"), (2, 27, "inconclusive"), (9, 100, "fail"),
                                        (0, 100, "inconclusive")])
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
