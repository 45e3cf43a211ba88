"""The bridge: token-by-token incremental replay of the recorded ids equals the live cache, bit for bit."""

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
from pytest_kvaudit.claims.htmlkit import e, section, status, table
from pytest_kvaudit.claims.notes import exact_note, ineligible_note


@register
class BridgeBitexact(Claim):
    name = "bridge_bitexact"
    exact = True  # lossy cache kinds are skipped, saying so (notes.lossy_note)
    needs = ("trajectory", "incremental")
    order = 40
    title = "Bridge: incremental vs live"
    thresholds = {"min_units": Threshold(12, "least eligible items compared", "items x precisions")}
    evidence = "min_units eligible (item, precision) units whose cache is plain per-layer K/V"

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"items_x_precisions": int(thresholds["min_units"])}

    def judge(self, ev: Evidence) -> ClaimResult:
        rows = [r for r in ev.eligible() if "incremental" in r.constructions]  # --kvaudit-exact-items: the first N
        unsupported = sorted({r.unsupported for r in rows if r.unsupported})
        if unsupported:
            return self.result(INCONCLUSIVE, 0, 0, unsupported[0])
        bad, details = [], []
        whole = "per_layer" in ev.config.engine.lacks  # the engine's state, compared as bytes
        for r in rows:
            a, b = r.constructions["live"], r.constructions["incremental"]
            if r.bridge_mismatch or not a.same_as(b):
                state = "the engine's state bytes" if whole else f"K/V of layers {','.join(r.bridge_mismatch)}"
                where = state if r.bridge_mismatch else (
                    "suffix" if a.suffix != b.suffix else "logits")
                bad.append(f"{r.item_id}@{r.dtype} ({where})")
                details.append(detail(r, "live", a, "incremental", b, differs=where))
        n, k = len(rows), len(rows) - len(bad)
        if bad:
            return self.result(FAIL, n, k, f"incremental differs from live on {names(bad)}", {"mismatches": len(bad)},
                               bad,
                               details=details)
        if n < ev.thresholds["min_units"]:
            return self.result(INCONCLUSIVE, n, k, f"{n} units, needs {int(ev.thresholds['min_units'])}"
                                                   f"{ineligible_note(ev.records, ev.config)}{exact_note(ev.config)}")
        what = "the engine's whole state, byte for byte" if whole else "every layer's K and V"
        return self.result(PASS, n, k,
                           f"incremental = live bit-exact on {k}/{n} ({what}, suffix){exact_note(ev.config)}")

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        return section(self.name, self.title, table(["verdict", "k/n", "reason"], [
            [status(result["status"]), f"{result['k']}/{result['n']}", e(result["reason"])]]))
