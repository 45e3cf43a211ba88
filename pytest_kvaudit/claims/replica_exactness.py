"""Replicas are exact: the same construction, precision and item computed twice is bit-identical.

A failure names the first differing replica (item@precision/construction) and what differs first: the suffix
token where the two part (with the top-2 margin there: how near a tie it was), else the boundary state's
fingerprint, else the logits' (replicas keep fingerprints only, so a state or logits difference has no size).
Nondeterministic kernels show up here, never as a refusal at load.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.base import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    names,
    register,
)
from pytest_kvaudit.claims.counterexample import detail
from pytest_kvaudit.claims.notes import exact_note, ineligible_note


@register
class ReplicaExactness(Claim):
    name = "replica_exactness"
    exact = True  # lossy cache kinds are skipped, saying so (notes.lossy_note)
    needs = ("trajectory", "prefill", "replicas")
    order = 10
    title = "Replicas: the same cell computed twice"
    thresholds = {"min_units": Threshold(12, "least replica pairs compared", "replica pairs")}
    evidence = "min_units replica pairs (item x construction x precision) compared"

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"replica_pairs": int(thresholds["min_units"])}

    def judge(self, ev: Evidence) -> ClaimResult:
        units, bad, details = 0, [], []
        for r in ev.eligible():
            for c in ("live", "prefill"):
                if f"{c}:replica" not in r.constructions:  # past --kvaudit-exact-items: no replica computed
                    continue
                units += 1
                a, b = r.constructions[c], r.constructions[f"{c}:replica"]
                if not a.same_as(b):
                    d = detail(r, c, a, f"{c}:replica", b)
                    d["differs"] = what = _what(a, b, d["position"])
                    bad.append(f"{r.item_id}@{r.dtype}/{c} ({what})")
                    details.append(d)
        k = units - len(bad)
        if bad:
            reason = (f"{len(bad)} replica(s) differ, the first {bad[0].split(' (')[0]} {_first(details[0])}: "
                      f"{names(bad)}")
            return self.result(FAIL, units, k, reason, {"mismatches": len(bad)}, bad, details=details)
        if units < ev.thresholds["min_units"]:
            return self.result(INCONCLUSIVE, units, k,
                               f"{units} replica units, needs {int(ev.thresholds['min_units'])}"
                               f"{ineligible_note(ev.records, ev.config)}{exact_note(ev.config)}")
        return self.result(PASS, units, k, f"all {units} replicas bit-identical{exact_note(ev.config)}")


def _what(a: Any, b: Any, position: int | None) -> str:
    """What differs first between a cell and its replica: a suffix token, else the state, else the logits."""
    if a.logits_fp and not b.logits_fp:  # the replica's own trajectory parted before reaching the boundary
        return "trajectory"
    if a.suffix != b.suffix:
        return f"suffix token {position}"
    return "state" if a.state_fp != b.state_fp else "logits"


def _first(d: dict[str, Any]) -> str:
    """The first counterexample in words, with the size of the difference where the record has one."""
    what = d["differs"]
    if what == "trajectory":
        return "in its trajectory (the replica's generation never reached the same boundary)"
    if what.startswith("suffix"):
        margin = d.get("margin_a")
        tie = f", top-2 margin there {margin:.3g}" if margin is not None else ""
        return f"at {what}{tie}"
    rest = "suffix identical" if what == "state" else "suffix and boundary state identical"
    return f"in its {what} fingerprint ({rest})"
