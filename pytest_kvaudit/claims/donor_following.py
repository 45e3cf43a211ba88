"""All-layer bidirectional K/V transplant: every divergent continuation follows its cache donor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..htmlkit import section, table
from ..stats import wilson_interval
from .base import FAIL, INCONCLUSIVE, PASS, Claim, ClaimResult, Evidence, Threshold, combine, names, register

DIRECTIONS = ("live_to_prefill", "prefill_to_live")


def donor_units(records: list[Any], max_units: int) -> list[Any]:
    """The units the claim judges: the first ``max_units`` eligible records with an all-layer transplant, in
    item order (chosen by divergence alone, never by outcome)."""
    return [r for r in records if r.eligible and r.whole_transplants()][:max_units]


@register
class DonorFollowing(Claim):
    name = "donor_following"
    order = 60
    title = "Transplant: all-layer K/V, both directions"
    thresholds = {
        "min_units": Threshold(10, "least divergent units per direction", "divergent units"),
        "confidence": Threshold(0.95, "confidence of the Wilson interval"),
    }
    evidence = "min_units divergent units per direction, on a model whose cache is plain per-layer K/V"

    def judge(self, ev: Evidence) -> ClaimResult:
        th = ev.thresholds
        rows = ev.eligible()
        unsupported = sorted({r.unsupported for r in rows if r.unsupported})
        figs: dict[str, Any] = {}
        bad, statuses, reasons = [], [], []
        n_all = k_all = 0
        chosen = donor_units(rows, ev.config.donor_max_units)
        for direction in DIRECTIONS:
            ts = [(r, t) for r in chosen for t in r.whole_transplants() if t.direction == direction]
            k = sum(t.followed for _, t in ts)
            n = len(ts)
            n_all, k_all = n_all + n, k_all + k
            lo, hi = wilson_interval(k, n, th["confidence"])
            figs[direction] = [k, n]
            figs[f"{direction}_wilson_lower"] = lo
            bad += [f"{r.item_id}@{r.dtype} {direction}" for r, t in ts if not t.followed]
            statuses.append(FAIL if k < n else INCONCLUSIVE if n < th["min_units"] else PASS)
            reasons.append(f"{direction} {k}/{n}")
        note = ""
        if unsupported:
            statuses.append(INCONCLUSIVE)
            note = f"; {unsupported[0]}"
        elif INCONCLUSIVE in statuses and not bad:
            note = f"; needs {int(th['min_units'])} divergent units per direction"
        reason = ("receivers that did not follow: " + names(bad) + "; " if bad else "") + ", ".join(reasons) + note
        return self.result(combine(statuses), n_all, k_all, reason, figs, bad,
                           interval=wilson_interval(k_all, n_all, th["confidence"]))

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if "live_to_prefill" not in f:
            return result.reason
        a, b = f["live_to_prefill"], f["prefill_to_live"]
        return f"live→prefill {a[0]}/{a[1]}, prefill→live {b[0]}/{b[1]}"

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {d: (int(figures[d][0]), int(figures[d][1])) for d in DIRECTIONS if d in figures}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        df = result.get("figures", {})
        if "live_to_prefill" not in df:
            return None
        rows = [[d, f"{df[d][0]}/{df[d][1]}", f"{df.get(d + '_wilson_lower', 0):.3f}"] for d in DIRECTIONS]
        return section("transplant", self.title, table(
            ["direction", "receivers following donor", "Wilson lower bound"], rows, "transplant"))
