"""Replicas are exact: the same construction, precision and item computed twice is bit-identical."""

from __future__ import annotations

from collections.abc import Mapping

from pytest_kvaudit.claims.base import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    detail,
    ineligible_note,
    names,
    register,
)


@register
class ReplicaExactness(Claim):
    name = "replica_exactness"
    needs = ("trajectory", "constructions", "replicas")
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
                units += 1
                a, b = r.constructions[c], r.constructions[f"{c}:replica"]
                if not a.same_as(b):
                    what = "suffix" if a.suffix != b.suffix else "state" if a.state_fp != b.state_fp else "logits"
                    bad.append(f"{r.item_id}@{r.dtype}/{c} ({what})")
                    details.append(detail(r, c, a, f"{c}:replica", b, differs=what))
        k = units - len(bad)
        if bad:
            return self.result(FAIL, units, k, f"{len(bad)} replica(s) differ: {names(bad)}", {"mismatches": len(bad)}, bad,
                               details=details)
        if units < ev.thresholds["min_units"]:
            return self.result(INCONCLUSIVE, units, k, f"{units} replica units, needs {int(ev.thresholds['min_units'])}"
                                                       f"{ineligible_note(ev.records)}")
        return self.result(PASS, units, k, f"all {units} replicas bit-identical")
