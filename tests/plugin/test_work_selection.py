"""Work follows the selected claims: a run computes and its plan prices what the selected claims read, the same
under ``-n 0`` and ``-n 2``; the plan has a row for a user's claim, says "not applicable" where a claim cannot
run, and what n a strict gate needs of each claim."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from kvtest import run, setup_suite
from pytest_kvaudit.claims import Claim, get, least_units
from pytest_kvaudit.claims.power import units_for_equivalence
from pytest_kvaudit.claims.rules import least_units_below
from pytest_kvaudit.core.cost.chance import count_chance
from pytest_kvaudit.core.cost.evidence import NOT_APPLICABLE, decides, rates, strict_n, strict_plan
from pytest_kvaudit.core.cost.pricing import Lengths
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import computes, constructions, work_of
from pytest_kvaudit.report.terminal import strict_lines

LIVE_VS_PREFILL = '''
import pytest

from pytest_kvaudit.claims import INCONCLUSIVE, PASS, Claim, register


@register
class LivePrefillLabels(Claim):
    name = "live_prefill_labels"
    needs = ("trajectory", "prefill")

    def judge(self, ev):
        rows = ev.eligible()
        same = sum(r.constructions["live"].label == r.constructions["prefill"].label for r in rows)
        return self.result(PASS if rows else INCONCLUSIVE, len(rows), same, f"{same}/{len(rows)} labels equal")


@pytest.mark.kvaudit_claim("live_prefill_labels")
def test_live_prefill_labels(kvaudit_judge):
    kvaudit_judge.claim()
'''


def test_the_work_of_some_needs_is_what_they_read_and_no_more() -> None:
    w = work_of(["trajectory", "prefill"])
    assert w == ("prefill", "trajectory")
    cfg = AuditConfig(work=w, chunks=(4,))
    # replicas, incremental, the 2x2's cells, transplants, controls, the sweep and the batch probe: not computed
    for what in ("replicas", "prefill:replica", "live:replica", "incremental", "fixed", "transplants", "controls",
                 "layer_sweep", "batch_invariance"):
        assert not cfg.computes(what), what
    assert (cfg.sweep_units, cfg.batch_units) == (0, 0)  # neither run nor priced
    # a construction asked for by option runs whatever the claims (a user's claim reads it)
    assert [s.name for s in constructions(cfg)] == ["prefill", "chunked(4)"]
    assert work_of(["controls"]) == ("controls", "prefill", "trajectory", "transplants")
    assert computes(None, "batch_invariance") and AuditConfig().work is None  # no selection: everything


def test_a_claim_that_declares_nothing_gets_everything() -> None:
    class Old(Claim):
        name = "old_user_claim"

    assert Old.needs is None
    from pytest_kvaudit.claims.needs import everything

    assert everything([Old()], [])


def test_a_need_that_names_nothing_the_run_computes_is_an_error() -> None:
    from pytest_kvaudit.claims import registered
    from pytest_kvaudit.claims.needs import builtin, work
    from pytest_kvaudit.core.errors import KvauditError

    builtins = [c for c in registered() if builtin(c)]

    class Chunked8(Claim):
        name = "chunked8"
        needs = ("trajectory", "chunked(8)")

    with pytest.raises(KvauditError, match=r"claim chunked8 needs 'chunked\(8\)', which this run does not compute"):
        work([Chunked8()], AuditConfig(), builtins)
    assert work([Chunked8()], AuditConfig(chunks=(8,)), builtins) == ("chunked(8)", "prefill", "trajectory")


def test_a_claim_needing_what_its_backend_lacks_is_not_applicable() -> None:
    class Swept(Claim):
        name = "swept"
        needs = ("transplants", "layer_sweep")

    assert Swept().applicable(AuditConfig()) is None
    why = Swept().applicable(AuditConfig(backend="llama.cpp")) or ""
    assert "llama.cpp backend cannot compute layer_sweep" in why
    plan = decides({"units": 1}, {"units": (10, 10)}, "why not")
    assert plan["decides"] == NOT_APPLICABLE and plan["why"] == "why not"


def test_the_strict_n_comes_from_each_claims_own_least_evidence() -> None:
    cfg = AuditConfig(dtypes=("bf16", "fp32"))
    per_item = rates(cfg, {})  # no sample: the bound, every item eligible
    fixed = strict_n(least_units("fixed_prefix_2x2"), per_item)
    assert fixed["n"] == least_units_below(0.02) == fixed["by"]["units_per_high_precision"]
    bridge = least_units("bridge_bitexact")
    assert strict_n(bridge, per_item)["n"] == bridge["items_x_precisions"] // 2  # an item is a unit per precision
    # above the donor units, no n gets there
    assert strict_n({"divergent_units_per_direction": 10}, per_item,
                    caps={"divergent_units_per_direction": 4})["n"] is None


def sample_of(divergent: dict[str, int], n: int = 8) -> dict[str, list[Lengths]]:
    return {d: [Lengths(10, 5, 5, True, i < k) for i in range(n)] for d, k in divergent.items()}


def test_a_calibration_that_saw_no_divergence_says_unknown_at_least_not_fails() -> None:
    # SmolLM2's plan: 8 calibration items, none divergent; the run then saw 25/197 (issue 37)
    cfg = AuditConfig(dtypes=("bf16", "fp32"))
    th = get("fixed_prefix_2x2").resolve(cfg)
    fixed = strict_plan(least_units("fixed_prefix_2x2"), sample_of({"bf16": 0, "fp32": 0}), cfg,
                        partial(get("fixed_prefix_2x2").strict_needs, th))
    assert fixed["n"] is None and fixed["at_least"] is not None and fixed["at_least"] >= 183
    donor = strict_plan(least_units("donor_following"), sample_of({"bf16": 0, "fp32": 0}), cfg)
    assert donor["n"] is None and donor["at_least"] is not None and 10 <= donor["at_least"] < 200
    lines = strict_lines({"decides": "yes", "needs": {}, "strict": donor}, 200)
    assert "unknown, at least" in lines[0] and "fails" not in lines[0]


def test_the_strict_n_is_an_80_percent_chance_with_its_range() -> None:
    cfg = AuditConfig(dtypes=("bf16", "fp32"))
    mc = get("matched_construction")
    sample = sample_of({"bf16": 25, "fp32": 0}, 197)  # SmolLM2's measured rates
    plan = strict_plan(least_units(mc), sample, cfg, partial(mc.strict_needs, mc.resolve(cfg)))
    lo, hi = plan["range"]
    assert plan["n"] == units_for_equivalence(25 / 197, 0.06) and lo is not None and hi is not None
    assert lo < plan["n"] < hi  # the interval of 25/197 spans 8.7% to 18%: fewer and more items
    # a recurrence needs 10 divergent units: at 25/197 per item, the items for an 80% chance of 10
    fixed = strict_plan({"divergent_units_per_low_precision": 10}, sample, cfg)
    n = fixed["n"]
    assert n is not None and count_chance(n, 25 / 197, 10) >= 0.8 > count_chance(n - 1, 25 / 197, 10)


def test_a_user_claim_alone_computes_only_what_it_reads(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_live_prefill=LIVE_VS_PREFILL)
    seen = []
    for workers in ("0", "2"):
        res, data = run(pytester, tiny_llama, "-n", workers)  # the conftest's --kvaudit-claims=none: this claim only
        assert res.ret == 0, res.stdout.str()[-3000:]
        cost = data["cost"]
        # every forward is the trajectory or the prefill this claim reads: no replica, 2x2 cell, transplant,
        # sweep or batch-probe forward, and the plan priced exactly that
        priced = data["plan"]["priced_after_run"]["forward_tokens"]
        assert cost["forward_tokens"] == cost["minimal_forward_tokens"] == priced
        assert data["plan"]["work"] == ["prefill", "trajectory"]
        assert set(data["plan"]["steps"]["bf16"]) == {"live", "prefill"}
        assert data["analyses"]["batch_invariance"] == [] and data["analyses"]["layer_sweep"]["units"] == []
        res.stdout.fnmatch_lines([f"cost * tokens (1.00x the {cost['minimal_forward_tokens']} the claims need)*"])
        seen.append((cost["forward_tokens"], cost["forward_calls"], data["plan"]["work"]))
    assert seen[0] == seen[1]  # every xdist worker knew the selection: -n 2 runs what -n 0 runs


def test_the_ledger_audit_alone_computes_less_than_every_claim(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    res, ledger = run(pytester, tiny_llama, "--kvaudit-claims=ledger_audit")
    assert res.ret == 0, res.stdout.str()[-3000:]
    res, full = run(pytester, tiny_llama, "--kvaudit-claims=all")
    assert res.ret in (0, 1), res.stdout.str()[-3000:]
    assert full["plan"]["work"] is None  # every built-in claim: everything, the analyses included
    assert ledger["cost"]["forward_tokens"] < full["cost"]["forward_tokens"]
    # the ledger reads every construction, the replicas, the 2x2's cells and the donors' transplants: no more
    assert ledger["cost"]["forward_tokens"] == ledger["cost"]["minimal_forward_tokens"]
    assert ledger["analyses"]["batch_invariance"] == []


def test_the_plan_has_a_row_for_a_user_claim_and_says_what_cannot_run(pytester: pytest.Pytester,
                                                                     tiny_llama: Path) -> None:
    pytester.makepyfile(test_live_prefill=LIVE_VS_PREFILL,
                        test_plain="def test_plain(kvaudit_records):\n    assert kvaudit_records\n")
    res, _ = run(pytester, tiny_llama, "--kvaudit-plan", "--kvaudit-claims=all")
    assert res.ret == 0, res.stdout.str()[-3000:]
    plan = json.loads((pytester.path / "report.json").read_text())["plan"]
    claims = plan["claims"]
    assert claims["live_prefill_labels"]["reads"] == ["trajectory", "prefill"]
    assert claims["lossy_cache_budget"]["decides"] == NOT_APPLICABLE  # no lossy --kvaudit-cache kind
    # a test that reads the store without a Claim class: a row too, and it gets everything
    assert claims["test_plain"]["decides"] == "not declared" and plan["work"] is None
    fixed = claims["fixed_prefix_2x2"]["strict"]
    assert fixed["by"]["units_per_high_precision"] >= least_units_below(0.02)  # over the eligibility rate
    # a random model answers nothing right: its labels cannot move, on the calibration's items at least
    res.stdout.fnmatch_lines(["*strict n: unknown, at least * items (eligible_items_per_precision 20 -> 20, "
                              "right_items_per_side 10 -> never, wrong_items_per_side 10 -> *, "
                              "accuracy_ci_within_margin -> *): the calibration's 8 items saw nothing to estimate*",
                              "*strict n: unknown, at least 183 items (*): the calibration's 8 items saw nothing to "
                              "estimate*",
                              "*strict n: 6 items (items_x_precisions 12 -> 6) for an 80% chance to pass*",
                              "lossy_cache_budget*decides: not applicable*",
                              "live_prefill_labels*decides:*"])
    # the strict gate: one n within the 14 items the set holds, and what it leaves out, with why
    res.stdout.fnmatch_lines(["kvaudit strict gate: --kvaudit-n=6 --kvaudit-claims=*replica_exactness*",
                              "  left out: matched_construction: labels cannot move: every answer is wrong on the "
                              "calibration's 8 items*",
                              "  left out: fixed_prefix_2x2: *the item set holds 14 items*"])
    assert plan["strict_gate"]["item_set_max"] == 14 and "fixed_prefix_2x2" not in plan["strict_gate"]["claims"]


def test_k_deselection_narrows_the_work(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, data = run(pytester, tiny_llama, "-k", "matched")
    assert res.ret == 0, res.stdout.str()[-3000:]
    assert data["plan"]["work"] == ["prefill", "trajectory"] and list(data["claims"]) == ["matched_construction"]
    assert data["cost"]["forward_tokens"] == data["cost"]["minimal_forward_tokens"]
