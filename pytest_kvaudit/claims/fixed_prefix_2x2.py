"""Fixed prefix ids, construction x precision: low-precision disagreements recur, FP32 shows none."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import LOW_PRECISION
from ..htmlkit import section, table
from ..stats import wilson_interval
from .base import FAIL, INCONCLUSIVE, PASS, Claim, ClaimResult, Evidence, Threshold, combine, names, register


@register
class FixedPrefix2x2(Claim):
    name = "fixed_prefix_2x2"
    order = 30
    title = "Fixed-prefix 2x2"
    thresholds = {
        "min_units": Threshold(20, "least fixed-prefix units per precision", "items"),
        "max_rate": Threshold(0.02, "the high precision's disagreement rate must stay at or below this", "rate"),
        "confidence": Threshold(0.95, "confidence of the Wilson interval"),
    }
    evidence = "a low and a high precision; min_units fixed-prefix units each"

    def judge(self, ev: Evidence) -> ClaimResult:
        th, records, dtypes = ev.thresholds, ev.records, ev.dtypes
        low = [d for d in dtypes if d in LOW_PRECISION]
        high = [d for d in dtypes if d not in LOW_PRECISION]
        disagreements: dict[str, int] = {}
        units: dict[str, int] = {}
        statuses, reasons, bad = [], [], []
        figs: dict[str, Any] = {"disagreements": disagreements, "n": units, "prefix_from": dtypes[0]}
        for d in dtypes:
            rows = [r for r in records if r.dtype == d and r.fixed]
            units[d] = len(rows)
            dis = [r.item_id for r in rows if r.fixed["replay"].suffix != r.fixed["prefill"].suffix]
            disagreements[d] = len(dis)
            if d in LOW_PRECISION:
                matched = {r.item_id for r in rows
                           if r.eligible and r.constructions["live"].suffix != r.constructions["prefill"].suffix}
                fixed_set = set(dis)
                recur = len(matched & fixed_set)
                figs.setdefault("recurrence", {})[d] = [recur, len(matched)]
                if d == dtypes[0]:
                    figs["recurrence_primary"] = [recur, len(matched)]
                if matched != fixed_set:
                    statuses.append(FAIL)
                    extra = sorted(fixed_set ^ matched)
                    bad += [f"{i}@{d}" for i in extra]
                    reasons.append(f"{d}: fixed-prefix divergent set differs from the matched one on {names(extra)}")
                elif len(rows) < th["min_units"]:
                    statuses.append(INCONCLUSIVE)
                    reasons.append(f"{d}: {len(rows)} fixed-prefix units, needs {int(th['min_units'])}")
                else:
                    statuses.append(PASS)
                    reasons.append(f"{d}: {recur}/{len(matched)} divergences recur")
            else:
                n = len(rows)
                lo, hi = wilson_interval(len(dis), n, th["confidence"])
                figs.setdefault("disagreement_upper", {})[d] = hi
                rate = len(dis) / n if n else 0.0
                bad += [f"{i}@{d}" for i in dis]
                if n and rate > th["max_rate"]:
                    statuses.append(FAIL)
                    reasons.append(f"{d}: {len(dis)}/{n} decoded disagreements ({rate:.1%} > {th['max_rate']:.0%}): {names(dis)}")
                elif n >= th["min_units"] and hi <= th["max_rate"]:
                    statuses.append(PASS)
                    reasons.append(f"{d}: {len(dis)}/{n} disagreements, Wilson upper {hi:.2%} <= {th['max_rate']:.0%}")
                else:
                    statuses.append(INCONCLUSIVE)
                    reasons.append(f"{d}: {len(dis)}/{n} disagreements, Wilson upper {hi:.2%} above "
                                   f"{th['max_rate']:.0%}: too few units")
        if not low or not high:
            statuses.append(INCONCLUSIVE)
            reasons.append("the 2x2 needs a low (bf16/fp16) and a high (fp32) precision in --kvaudit-dtypes")
        n_hi = sum(units[d] for d in high)
        k_hi = n_hi - sum(disagreements[d] for d in high)
        return self.result(combine(statuses), n_hi, k_hi, "; ".join(reasons), figs, bad,
                           interval=wilson_interval(k_hi, n_hi, th["confidence"]))

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if not f.get("disagreements"):
            return result.reason
        parts = [f"{d}: {v}/{f['n'][d]} disagree" for d, v in f["disagreements"].items()]
        for d, hi in f.get("disagreement_upper", {}).items():
            parts.append(f"{d} Wilson upper {hi:.2%}")
        rec = f.get("recurrence_primary")
        if rec:
            parts.append(f"recurrence {rec[0]}/{rec[1]}")
        return "; ".join(parts)

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {f"disagreements[{d}]": (int(v), int(figures.get("n", {}).get(d, 0)))
                for d, v in (figures.get("disagreements") or {}).items()}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        fx = result.get("figures", {})
        if not fx.get("disagreements"):
            return None
        up = fx.get("disagreement_upper", {})
        rows = [[d, f"{fx['disagreements'][d]}/{fx['n'][d]}", f"{up[d]:.2%}" if d in up else "-",
                 "/".join(map(str, fx.get("recurrence", {}).get(d, []))) or "-"] for d in fx["disagreements"]]
        return section("2x2", f"{self.title} (prefix ids from {fx.get('prefix_from')})", table(
            ["precision", "replay vs prefill disagreements", "Wilson upper bound", "recurrence of matched set"], rows,
            "2x2"))
