"""Lossy caches stay within a label-change budget; an offloaded cache is the resident one, bit for bit.

A quantized K/V cache is lossy by design, so asking it to be exact says nothing: the question a deployment
has is whether it changes answers. Each lossy kind (``--kvaudit-cache=quantized:...``) is audited against the
exact dynamic cache on the same prefix ids and the same one-shot schedule, so the cache is the only
difference (:func:`pytest_kvaudit.core.compute.probes.lossy_axis`). Per kind and precision it reports divergent
suffixes, where they part (median, quartiles and every position), the exact cache's top-2 margin there
(how near a tie the choice was) and label changes with their bounds. The rule is symmetric and exact
(:func:`pytest_kvaudit.claims.rules.rate_decision`): it passes when the Clopper-Pearson upper bound (one-sided
97.5%) is within the budget ("label changes below 10% (97.5%)"), fails when the Clopper-Pearson lower bound is
above it (one-sided, alpha split over the run's lossy kinds and precisions, so the claim's FAIL size stays at
most 2.5%), and is inconclusive in between or with no units. The Wilson interval is reported beside it.
The offloaded kind moves K/V, it does not round them: it must equal the resident cache bit for bit, and is
no audit at all off CUDA, which the result says.
"""

from __future__ import annotations

import statistics
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
    combine,
    names,
    register,
)
from pytest_kvaudit.claims.htmlkit import e, section, status, table
from pytest_kvaudit.claims.power import rate_chances
from pytest_kvaudit.claims.rules import least_units_below, rate_decision
from pytest_kvaudit.claims.stats import wilson_interval
from pytest_kvaudit.core.model.cache_kinds import OFFLOADED, is_lossy
from pytest_kvaudit.core.model.config import AuditConfig

NOT_MEANINGFUL = "n/a"


def spread(positions: list[int]) -> dict[str, Any]:
    """Median, quartiles and the sorted list of first divergent positions (None where there are none)."""
    p = sorted(positions)
    if not p:
        return {"median": None, "q1": None, "q3": None, "positions": []}
    q1, _, q3 = statistics.quantiles(p, n=4, method="inclusive") if len(p) > 1 else (p[0], p[0], p[0])
    return {"median": statistics.median(p), "q1": q1, "q3": q3, "positions": p}


def mean(xs: list[float]) -> float | None:
    return round(statistics.fmean(xs), 6) if xs else None


@register
class LossyCacheBudget(Claim):
    name = "lossy_cache_budget"
    needs = ("trajectory", "prefill")  # and the lossy cache probes, which --kvaudit-cache asks for
    order = 70
    title = "Lossy caches: label changes within a budget"
    thresholds = {"budget": Threshold(0.10, "largest label-change rate a lossy cache may cause (one-sided 97.5% "
                                            "Clopper-Pearson upper bound of changed labels against the exact cache)",
                                  "rate")}
    evidence = ("eligible units with an extracted exact-cache answer, enough for the Clopper-Pearson upper bound to "
                "clear the budget (36 at 0 changes for 0.10), per lossy kind and precision")

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"units": least_units_below(thresholds["budget"])}

    def verdict_chance(self, n: int, discordance: float, thresholds: Mapping[str, float]) -> float | None:
        """P(pass) + P(fail) on ``n`` units of one kind and precision at a true label-change rate."""
        p, f = rate_chances(n, discordance, thresholds["budget"])
        return float(p + f)

    def applicable(self, config: AuditConfig) -> str | None:
        if any(is_lossy(k) or k == OFFLOADED for k in config.cache_axes):
            return None
        return ("no lossy or offloaded cache kind was asked for: add e.g. "
                "--kvaudit-cache=dynamic,quantized:quanto-int4 (or offloaded)")

    def judge(self, ev: Evidence) -> ClaimResult:
        budget = ev.thresholds["budget"]
        kinds = [k for k in ev.config.cache_axes if is_lossy(k) or k == OFFLOADED]
        figures: dict[str, Any] = {"budget": budget, "kinds": {}}
        parts: list[str] = []
        why: list[str] = []
        bad: list[str] = []
        n_all = k_all = 0
        verdicts = sum(1 for k in kinds if is_lossy(k)) * len(ev.dtypes)  # the FAIL alpha is split over them
        for kind in kinds:
            for dtype in ev.dtypes:
                probes = [(r, r.probes.cache[kind]) for r in ev.eligible() if r.dtype == dtype
                          and kind in r.probes.cache]
                part = (self._lossy(kind, dtype, probes, budget, bad, verdicts) if is_lossy(kind)
                        else self._offloaded(kind, dtype, probes, budget, bad))
                figures["kinds"].setdefault(kind, {})[dtype] = part
                why.append(f"{kind} {dtype}: {part['reason']}")
                if part["status"] != NOT_MEANINGFUL:
                    parts.append(part["status"])
                    n_all, k_all = n_all + part["n"], k_all + part["k"]
        verdict = combine(parts)
        reason = "; ".join(why) if why else "no lossy cache kind in this run"
        return self.result(verdict, n_all, k_all, reason, figures, bad[:64])

    def _lossy(self, kind: str, dtype: str, probes: list[tuple[Any, dict[str, Any]]], budget: float,
               bad: list[str], verdicts: int = 1) -> dict[str, Any]:
        """One lossy kind at one precision: the table's row and its verdict."""
        units = [(r, o) for r, o in probes if o.get("eligible") and o.get("exact_extracted")]
        moved = [o for _, o in probes if o.get("eligible") and not o["suffix_equal"]]
        changed = [r.item_id for r, o in units if o["label"] != o["exact_label"]]
        bad += [f"{i}@{dtype} ({kind}: label changed)" for i in changed]
        n, c = len(units), len(changed)
        low, high = wilson_interval(c, n) if n else (None, None)
        st, reason, lower, upper = budget_verdict(c, n, budget, verdicts, changed)
        eligible = [o for _, o in probes if o.get("eligible")]
        return {"status": st, "reason": reason, "n": n, "k": n - c, "lossy": True,
                "divergent_suffixes": [len(moved), len(eligible)],
                "first_divergence": spread([o["position"] for o in moved if o["position"] is not None]),
                "label_changes": [c, n], "label_change_interval": [low, high],
                "label_change_bounds": [lower, upper] if n else None,
                "margin_at_divergence": mean([o["margin_exact"] for o in moved if o.get("margin_exact") is not None]),
                "margin_at_divergence_lossy": mean([o["margin_lossy"] for o in moved
                                                    if o.get("margin_lossy") is not None])}

    def _offloaded(self, kind: str, dtype: str, probes: list[tuple[Any, dict[str, Any]]], budget: float,
                   bad: list[str]) -> dict[str, Any]:
        """The offloaded kind at one precision: bit-exact with the resident cache, or no audit off CUDA."""
        units = [(r, o) for r, o in probes if o.get("eligible")]
        if not units:
            reasons = sorted({o.get("reason", "") for _, o in probes}) or ["no eligible unit"]
            return {"status": NOT_MEANINGFUL, "reason": reasons[0], "n": 0, "k": 0, "lossy": False}
        off = [f"{r.item_id}@{dtype} ({kind}: not bit-exact with the resident cache)" for r, o in units
               if not (o["state_equals_dynamic"] and o["suffix_equals_dynamic"])]
        bad += off
        n, k = len(units), len(units) - len(off)
        st = FAIL if off else PASS
        return {"status": st, "n": n, "k": k, "lossy": False,
                "reason": f"differs from the resident cache on {len(off)}/{n}" if off else f"bit-exact on {k}/{n}"}

    def rejudge(self, result: Mapping[str, Any], thresholds: Mapping[str, float]) -> ClaimResult | None:
        """Each lossy kind's label changes judged again from their recorded counts; an offloaded kind's bit-exact
        verdict stands as recorded."""
        figs = {**result["figures"], "kinds": {k: dict(per) for k, per in result["figures"].get("kinds", {}).items()}}
        verdicts = sum(1 for per in figs["kinds"].values() for p in per.values() if p.get("lossy"))
        parts, why = [], []
        for kind, per in figs["kinds"].items():
            for dtype, p in per.items():
                if p.get("lossy"):
                    c, n = p["label_changes"]
                    mark = f"@{dtype} ({kind}: label changed)"
                    changed = [u[: -len(mark)] for u in result.get("counterexamples", []) if u.endswith(mark)]
                    st, reason, lower, upper = budget_verdict(c, n, thresholds["budget"], verdicts, changed)
                    per[dtype] = p = {**p, "status": st, "reason": reason,
                                      "label_change_bounds": [lower, upper] if n else None}
                why.append(f"{kind} {dtype}: {p['reason']}")
                if p["status"] != NOT_MEANINGFUL:
                    parts.append(p["status"])
        return self.result(combine(parts), result["n"], result["k"], "; ".join(why) or result["reason"], figs,
                           result.get("counterexamples"), details=result.get("details"))

    def key_figure(self, result: ClaimResult) -> str:
        rows = []
        for kind, per in result.figures.get("kinds", {}).items():
            for dtype, p in per.items():
                if p.get("lossy"):
                    rows.append(f"{kind} {dtype}: labels {p['label_changes'][0]}/{p['label_changes'][1]}, "
                                f"suffixes {p['divergent_suffixes'][0]}/{p['divergent_suffixes'][1]}")
                else:
                    rows.append(f"{kind} {dtype}: {p['reason']}")
        return "; ".join(rows) or result.reason

    def statistic(self, result: ClaimResult) -> str:
        return "Wilson 95% CI of unchanged labels k/n (verdicts on Clopper-Pearson bounds of label changes)"

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {f"{kind}/{dtype}": tuple(p["label_changes"]) for kind, per in figures.get("kinds", {}).items()
                for dtype, p in per.items() if p.get("lossy")}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        return section(self.name, self.title, table(
            ["cache", "precision", "divergent suffixes", "first divergent position (median [q1, q3])",
             "label changes (Wilson 95%)", "mean top-2 margin there", "verdict"], lossy_rows(result)))


def budget_verdict(c: int, n: int, budget: float, verdicts: int, changed: list[str]) -> tuple[str, str, float, float]:
    """One lossy kind's verdict at one precision from ``c`` label changes of ``n`` units (``changed`` names them):
    status, reason and the Clopper-Pearson (lower, upper) bounds; the FAIL alpha split over ``verdicts``."""
    verdict, lower, upper = rate_decision(c, n, budget, verdicts=verdicts)
    pct, low = f"{budget * 100:g}%", f"{100 - 2.5 / verdicts:.4g}%"
    if n == 0:
        return INCONCLUSIVE, "no eligible unit with an extracted answer", lower, upper
    if verdict == PASS:
        return PASS, (f"label changes below {pct} (97.5%): {c}/{n}, one-sided 97.5% Clopper-Pearson upper "
                      f"{upper:.3f} <= budget {budget:g}"), lower, upper
    if verdict == FAIL:  # the exact lower bound: a rate at the budget fails no more than alpha of runs
        return FAIL, (f"label changes above {pct} ({low}): {c}/{n}, one-sided {low} Clopper-Pearson lower "
                      f"{lower:.3f} > budget {budget:g} (alpha split over {verdicts} verdicts; {names(changed, 4)})"),\
            lower, upper
    need = least_units_below(budget, c)
    return INCONCLUSIVE, (f"label changes {c}/{n}, one-sided 97.5% Clopper-Pearson upper {upper:.3f} > budget "
                          f"{budget:g} and one-sided {low} lower {lower:.3f} not above it: needs "
                          f"{need if need else 'more'} units at {c} changes"), lower, upper


def lossy_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """The lossy-cache table's rows (kind, precision, suffixes, position, labels, margin, verdict)."""
    out = []
    for kind, per in result.get("figures", {}).get("kinds", {}).items():
        for dtype, p in per.items():
            if not p.get("lossy"):
                out.append([e(kind), e(dtype), "", "", "", "", e(f"{p['status']}: {p['reason']}")])
                continue
            f, (c, n), iv = p["first_divergence"], p["label_changes"], p["label_change_interval"]
            pos = f"{f['median']:g} [{f['q1']:g}, {f['q3']:g}]" if f["median"] is not None else "-"
            band = f"{c}/{n} [{iv[0]:.3f}, {iv[1]:.3f}]" if n else "0/0"
            m = p["margin_at_divergence"]
            out.append([e(kind), e(dtype), f"{p['divergent_suffixes'][0]}/{p['divergent_suffixes'][1]}", pos, band,
                        "-" if m is None else f"{m:.4f}", status(p["status"])])
    return out
