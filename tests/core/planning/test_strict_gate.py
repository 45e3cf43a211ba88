"""The strict gate ``--kvaudit-plan`` prints: one n for the claims it keeps, each claim it leaves out with why, and
the rates it plans on (labels included), on plain data; the whole recipe runs in tests/plugin/test_users_path.py."""

from __future__ import annotations

from functools import partial

from pytest_kvaudit.claims import get, least_units
from pytest_kvaudit.core.cost.evidence import NOT_APPLICABLE, evidence, strict_plan
from pytest_kvaudit.core.cost.pricing import Lengths
from pytest_kvaudit.core.itemsets.builtin_items import BUILTIN_MAX, builtin_item_set
from pytest_kvaudit.core.model.config import EMBEDDED_DIR, EMBEDDED_SNAPSHOTS, AuditConfig
from pytest_kvaudit.core.model.items import load_item_set
from pytest_kvaudit.core.planning.ledger_price import recorded_rows
from pytest_kvaudit.core.planning.plan import rows_lengths
from pytest_kvaudit.core.planning.strict_gate import gate_lines, most_items, strict_gate

BASIS = "the 200 items recorded in the ledger L"


def row(n: int | None, needs: dict[str, tuple[float, float | None]] | None = None, decides: str = "yes",
        **by: int | None) -> dict[str, object]:
    """A plan's claim row: its strict n, what each need asks and expects, and the items each need gives."""
    return {"decides": decides, "needs": {w: {"needs": k, "expected": e} for w, (k, e) in (needs or {}).items()},
            "strict": {"n": n, "by": by, "at_least": None}}


def test_one_n_for_the_claims_kept_and_each_left_out_says_why() -> None:
    claims = {
        "replica_exactness": row(3, {"replica_pairs": (12, 800)}, replica_pairs=3),
        "matched_construction": row(None, {"wrong_items_per_side": (10, 0.0)}, wrong_items_per_side=None,
                                    accuracy_ci_within_margin=636),
        "fixed_prefix_2x2": row(189, {"units_per_high_precision": (189, 200)}, units_per_high_precision=189),
        "donor_following": row(57, {"divergent_units_per_direction": (10, 43)}, divergent_units_per_direction=57),
        "too_rare": row(450, {"units": (12, 200)}, units=450),
        "prefix_cache": {**row(6, {"items_x_precisions": (12, 400)}), "decides": NOT_APPLICABLE, "why": "no cache"},
        "test_plain": {"decides": "not declared", "needs": {}, "strict": {"n": None, "by": {}}},
    }
    gate = strict_gate(claims, 200, BASIS)
    assert gate["n"] == 189 and gate["claims"] == ["replica_exactness", "fixed_prefix_2x2", "donor_following"]
    # the replicas run on the first --kvaudit-exact-items items: no more than their claim needs
    assert gate["args"] == ("--kvaudit-n=189 --kvaudit-claims=replica_exactness,fixed_prefix_2x2,donor_following "
                            "--kvaudit-exact-items=3")
    assert set(gate["cannot"]) == {"matched_construction", "too_rare"}  # a skip is no failure: not listed
    assert gate["cannot"]["matched_construction"].startswith(
        f"labels cannot move: every answer is right on {BASIS} (it needs 10 items wrong on each side")
    assert "the item set holds 200 items, fewer than it needs" in gate["cannot"]["matched_construction"]
    assert "accuracy_ci_within_margin -> 636" in gate["cannot"]["matched_construction"]
    assert "(units -> 450)" in gate["cannot"]["too_rare"]
    lines = gate_lines(gate)
    assert lines[0] == f"kvaudit strict gate: {gate['args']}"
    assert lines[-2].startswith("  left out: matched_construction: labels cannot move")
    # a larger item set keeps the rare claim, and n follows it; an exact-items run of the user's keeps its own
    bigger = strict_gate(claims, BUILTIN_MAX, BASIS, exact_items=50)
    assert bigger["n"] == 450 and "too_rare" in bigger["claims"] and "exact-items" not in bigger["args"]


def test_no_claim_kept_is_said_not_an_empty_selection() -> None:
    gate = strict_gate({"x": row(None, {"units": (12, 0.0)}, units=None)}, 200, BASIS)
    assert gate["n"] is None and gate["args"] == "" and gate["claims"] == []
    assert gate_lines(gate)[0].startswith("kvaudit strict gate: none: no selected claim reaches a verdict")
    assert gate["cannot"]["x"].startswith("no n up to 1000 gives it an 80% chance of a verdict")


def test_the_item_sets_size_is_its_own_whatever_n_the_run_asked() -> None:
    assert most_items(builtin_item_set(12)) == BUILTIN_MAX
    assert most_items(load_item_set(EMBEDDED_DIR / "items.jsonl", 12)) == 200


def labelled(right: list[tuple[bool, bool]]) -> list[Lengths]:
    return [Lengths(10, 5, 5, True, False, right=r) for r in right]


def test_labels_that_cannot_move_leave_matched_construction_no_n() -> None:
    """Every answer right, on both sides: no n gives matched_construction its min_each wrong items; one wrong
    answer in ten on each side gives it some n (the construction that breaks 'cannot move')."""
    cfg = AuditConfig(dtypes=("bf16", "fp32"))
    mc = get("matched_construction")
    needs = least_units(mc)
    assert needs["wrong_items_per_side"] == needs["right_items_per_side"] == 10
    further = partial(mc.strict_needs, mc.resolve(cfg))
    right = {d: labelled([(True, True)] * 200) for d in cfg.dtypes}
    assert evidence(cfg, 200, right)["wrong_items_per_side"] == (200, 0.0)
    plan = strict_plan(needs, right, cfg, further)
    assert plan["n"] is None and plan["by"]["wrong_items_per_side"] is None
    some = {d: labelled([(i % 10 != 0, i % 10 != 0) for i in range(200)]) for d in cfg.dtypes}
    assert evidence(cfg, 200, some)["wrong_items_per_side"] == (200, 20.0)
    assert strict_plan(needs, some, cfg, further)["by"]["wrong_items_per_side"] is not None
    # a calibration that extracted no labels (an engine's own) leaves the need to the run, never 'cannot move'
    unknown = {d: [Lengths(10, 5, 5, True, False)] * 8 for d in cfg.dtypes}
    assert evidence(cfg, 200, unknown)["wrong_items_per_side"] == (200, None)


def test_the_embedded_ledger_shows_every_answer_right() -> None:
    """The shipped ledger's 200 items at both precisions, as the plan reads them: right on both sides."""
    import json

    doc = json.loads((EMBEDDED_SNAPSHOTS / "test_ledger_audit" / "test_ledger_audit.json").read_text())
    items = load_item_set(EMBEDDED_DIR / "items.jsonl").items
    prompts = {it.id: 10 for it in items}
    rows = recorded_rows(doc, list(prompts), prompts, ("bf16", "fp32"))
    lens = {d: rows_lengths(r, 96) for d, r in rows.items()}
    assert {d: len(x) for d, x in lens.items()} == {"bf16": 200, "fp32": 200}
    assert all(x.right == (True, True) for xs in lens.values() for x in xs)
    assert sum(x.divergent for x in lens["bf16"]) > sum(x.divergent for x in lens["fp32"]) == 0


def test_a_run_below_a_claims_strict_n_is_warned() -> None:
    from pytest_kvaudit.report.terminal import strict_lines

    c = {"decides": "yes", "needs": {}, "strict": {"n": 20, "by": {"units": 20}, "range": [20, 20]}}
    assert "WARNING: this run has n=8, so --kvaudit-strict is likely to fail it" in strict_lines(c, 8)[0]
    assert "WARNING" not in strict_lines(c, 20)[0]
