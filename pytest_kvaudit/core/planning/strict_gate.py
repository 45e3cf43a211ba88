"""The strict gate a run can pass (``--kvaudit-plan``'s last lines, the plan's ``strict_gate`` block): one
``--kvaudit-n`` for the whole run, the least n at which every claim it keeps reaches a verdict with an 80% chance
at the rates the plan expects, within the item set's own size; the ``--kvaudit-claims`` selection of those
claims; and each claim that no n of this item set gets there, with why (labels that cannot move, an item set
too small, a rate the calibration could not estimate).

Each claim's strict n is its own (:func:`pytest_kvaudit.core.cost.evidence.strict_plan`, on the claims' rules
through :meth:`Claim.strict_needs`); this module only sets them against the item set and against each other.
Under ``--kvaudit-strict`` an inconclusive claim fails the job, so a gate that keeps a claim it cannot decide
fails every checkpoint: the selection is what makes the gate passable, and the lines say what it leaves out.
No pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.cost.chance import TARGET
from pytest_kvaudit.core.cost.evidence import NOT_APPLICABLE
from pytest_kvaudit.core.itemsets.builtin_items import BUILTIN_MAX, is_builtin
from pytest_kvaudit.core.model.items import parse_lines

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.items import ItemSet

#: the evidence kinds the replicas and the bridge give: computed on the first ``--kvaudit-exact-items`` only
EXACT_KINDS = frozenset({"replica_pairs", "items_x_precisions"})


def most_items(item_set: ItemSet) -> int:
    """The most items this item set can give a run: a built-in set's generator maximum, a file's own lines (the
    embedded checkpoint's 200), whatever ``--kvaudit-n`` this run asked."""
    if is_builtin(str(item_set.path)):
        return BUILTIN_MAX
    try:
        return len(parse_lines(item_set.path.read_text(encoding="utf-8"), item_set.path))
    except OSError:
        return len(item_set.items)


def labels_why(claim: Mapping[str, Any], basis: str) -> str | None:
    """Why labels cannot move, where a claim needs items right and wrong and the basis shows none of one kind."""
    st = claim.get("strict") or {}
    needs = claim.get("needs") or {}
    for what, kind, other in (("wrong_items_per_side", "right", "wrong"), ("right_items_per_side", "wrong", "right")):
        row = needs.get(what) or {}
        if what in (st.get("by") or {}) and st["by"][what] is None and row.get("expected") == 0:
            return (f"labels cannot move: every answer is {kind} on {basis} (it needs {row.get('needs')} items "
                    f"{other} on each side, live and prefill)")
    return None


def why_not(name: str, claim: Mapping[str, Any], most: int, basis: str) -> str | None:
    """Why a strict gate cannot keep ``claim`` on this item set (None: it can, at ``claim['strict']['n']``)."""
    if claim.get("decides") == NOT_APPLICABLE:
        return f"not applicable here ({claim.get('why')}): its test skips, which a strict gate allows"
    st = claim.get("strict") or {}
    n = st.get("n")
    reasons = [r for r in (labels_why(claim, basis),) if r]
    too_many = {w: v for w, v in (st.get("by") or {}).items() if v is not None and v > most}
    if too_many:
        reasons.append(f"the item set holds {most} items, fewer than it needs for an {TARGET:.0%} chance of a "
                       "verdict (" + ", ".join(f"{w} -> {v}" for w, v in too_many.items()) + ")")
    if reasons:
        return "; ".join(reasons)
    if claim.get("decides") == "never":
        return "no number of items clears its threshold"
    if n is None and st.get("at_least") is not None:
        return (f"unknown: {basis} showed nothing to estimate a rate from, so at least {st['at_least']} items "
                "(a larger calibration, or a ledger recorded on the whole set, tells)")
    if n is None:
        return f"no n up to {BUILTIN_MAX} gives it an {TARGET:.0%} chance of a verdict at the rates of {basis}"
    return None


def strict_gate(claims: Mapping[str, Mapping[str, Any]], most: int, basis: str,
                exact_items: int | None = None) -> dict[str, Any]:
    """The strict gate over the plan's claim rows: ``n`` (None when no claim can be kept), the ``claims`` it
    keeps, the ones it ``cannot`` keep with why, and the ``args`` to run it with; ``exact_items`` (the least
    ``--kvaudit-exact-items`` its replica and bridge claims need, when fewer than ``n``) keeps the recipe as
    cheap as its claims allow."""
    keep: dict[str, int] = {}
    cannot: dict[str, str] = {}
    for name, c in claims.items():
        if c.get("decides") == "not declared":
            continue  # a test without a Claim class: --kvaudit-claims does not select it
        why = why_not(name, c, most, basis)
        if why is None:
            keep[name] = int(c["strict"]["n"])
        elif c.get("decides") != NOT_APPLICABLE:
            cannot[name] = why
    n = max(keep.values(), default=None)
    # the replicas and the bridge run on the first --kvaudit-exact-items items: no more than their claims need
    k = max((keep[k] for k in keep if set(claims[k].get("needs") or {}) <= EXACT_KINDS), default=None)
    args = [] if n is None else [f"--kvaudit-n={n}", f"--kvaudit-claims={','.join(keep)}"]
    if n is not None and k is not None and k < n and exact_items is None:
        args.append(f"--kvaudit-exact-items={k}")
    return {"n": n, "claims": list(keep), "cannot": cannot, "item_set_max": most, "chance": TARGET,
            "basis": basis, "args": " ".join(args)}


def gate_lines(gate: Mapping[str, Any]) -> list[str]:
    """The gate as ``--kvaudit-plan`` prints it: the arguments on a line of their own (the README's CI recipe
    reads them as printed), then each claim left out and why."""
    if not gate:
        return []
    if gate.get("n") is None:
        out = [f"kvaudit strict gate: none: no selected claim reaches a verdict with an {gate['chance']:.0%} chance "
               f"within the item set's {gate['item_set_max']} items"]
    else:
        out = [f"kvaudit strict gate: {gate['args']}",
               f"  ({gate['n']} items: the least n at which each of {', '.join(gate['claims'])} reaches a verdict "
               f"with an {gate['chance']:.0%} chance at the rates of {gate['basis']}; the item set holds "
               f"{gate['item_set_max']})"]
    out += [f"  left out: {name}: {why}" for name, why in gate.get("cannot", {}).items()]
    return out


def selection_basis(rows: Mapping[str, Sequence[Any]], ledger: Mapping[str, Any] | None) -> str:
    """Where the gate's rates come from, in words."""
    n = max((len(r) for r in rows.values()), default=0)
    if ledger is not None:
        return f"the {n} items recorded in the ledger {ledger.get('path')}"
    return f"the calibration's {n} items"
