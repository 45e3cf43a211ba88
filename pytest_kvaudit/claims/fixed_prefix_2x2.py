"""Fixed prefix ids, construction x precision: low-precision disagreements recur, FP32 disagreement stays below
2% (97.5%).

**Recurrence** (each low precision, bf16 and fp16): the matched comparison (live cache vs prefill) at a
precision runs on *that precision's own* prefix, so it can only be set against the 2x2 where the two
are over the same ids. The comparable units of a low precision are its eligible items whose own prefix
equals the fixed prefix, id for id: always all of its eligible items when it is the first precision;
when the prefix came from another precision (``--kvaudit-dtypes=fp32,bf16``, or fp16 after bf16), the
items where its own trajectory reached the same prefix. On those units, the set whose fixed-prefix
cells disagree must equal the set whose matched cells disagree (``recurrence`` k/n: matched
divergences that recur in the 2x2 / matched divergences), and at least ``min_recurring`` matched
divergences must be there to recur; units outside the comparison still count in ``disagreements``
and are reported as ``recurrence_excluded``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.base import (
    FAIL,
    INCONCLUSIVE,
    NO_INTERVAL,
    PASS,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    combine,
    names,
    register,
)
from pytest_kvaudit.claims.counterexample import detail
from pytest_kvaudit.claims.htmlkit import section, table
from pytest_kvaudit.claims.power import items_for, rate_chances, units_for_rate
from pytest_kvaudit.claims.rules import least_units_below, one_sided_alpha, rate_decision
from pytest_kvaudit.claims.stats import wilson_interval
from pytest_kvaudit.core.model.config import LOW_PRECISION


def _rate_reason(d: str, status: str, k: int, n: int, bounds: tuple[float, float, float], max_rate: float,
                 need: int | None, dis: list[str], alphas: tuple[float, float]) -> str:
    """The high precision's verdict in words: what the rule shows, the bound that decided it and its level."""
    lower, upper, wilson = bounds
    pct = f"{max_rate * 100:g}%"
    paper = f"the paper's Wilson upper bound {wilson:.2%}" if n else "no Wilson bound"
    up, low = (f"{100 * (1 - a):.4g}%" for a in alphas)
    if status == FAIL:
        return (f"{d.upper()} disagreement above {pct} ({low}): {k}/{n} decoded disagreements, one-sided "
                f"{low} Clopper-Pearson lower bound {lower:.2%} > {pct}: {names(dis)}")
    if status == PASS:
        return (f"{d.upper()} disagreement below {pct} ({up}): {k}/{n} disagreements, one-sided {up} "
                f"Clopper-Pearson upper bound {upper:.2%} <= {pct} ({paper})")
    needs = f"needs {need} units at {k} disagreements" if need else "no number of units clears it"
    return (f"{k}/{n} disagreements, one-sided {up} Clopper-Pearson upper bound {upper:.2%} above {pct} "
            f"and one-sided {low} lower bound {lower:.2%} not above it ({paper}): {needs}, has {n}")


def _high(d: str, k: int, n: int, th: Mapping[str, float], verdicts: int, dis: list[str],
          figs: dict[str, Any]) -> tuple[str, str]:
    """A high precision's rate verdict, its reason, and its figures written into ``figs``: ``k`` of ``n`` fixed-prefix
    units disagree, ``dis`` names them, the FAIL alpha is split over the run's ``verdicts`` high precisions."""
    status, lower, hi = rate_decision(k, n, th["max_rate"], th["confidence"], verdicts)
    wilson = wilson_interval(k, n, th["confidence"])[1] if n else None
    need = least_units_below(th["max_rate"], k, th["confidence"])
    for key, value in (("disagreement_upper", hi if n else None), ("disagreement_lower", lower if n else None),
                       ("wilson_upper", wilson), ("verdict", status), ("units_needed", need)):
        figs.setdefault(key, {})[d] = value
    figs["bounds"] = ("Clopper-Pearson upper, one-sided 1 - alpha, and lower, one-sided 1 - alpha / (high "
                      "precisions), alpha = (1 - confidence) / 2; wilson_upper: the paper's figure")
    alpha = one_sided_alpha(th["confidence"])
    return status, _rate_reason(d, status, k, n, (lower, hi, wilson or 1.0), th["max_rate"], need, dis,
                                (alpha, alpha / verdicts))


def _recurrence(d: str, rows: list[Any], th: Mapping[str, float], figs: dict[str, Any], bad: list[str],
                details: list[dict[str, Any]], first: bool) -> tuple[str, str]:
    """A low precision's recurrence verdict and reason, its figures written into ``figs`` and its counterexamples
    into ``bad`` and ``details``: on the units over the fixed prefix ids, the 2x2's divergent set must equal the
    matched one (see the module's docstring)."""
    comp = [r for r in rows if r.recurrence_comparable]
    matched = {r.item_id for r in comp if r.constructions["live"].suffix != r.constructions["prefill"].suffix}
    fixed_set = {r.item_id for r in comp if r.fixed["replay"].suffix != r.fixed["prefill"].suffix}
    recur = len(matched & fixed_set)
    figs.setdefault("recurrence", {})[d] = [recur, len(matched)]
    figs.setdefault("recurrence_units", {})[d] = len(comp)
    figs.setdefault("recurrence_excluded", {})[d] = len(rows) - len(comp)
    figs.setdefault("fixed_only", {})[d] = len(fixed_set - matched)
    if first:
        figs["recurrence_primary"] = [recur, len(matched)]
    if matched != fixed_set:
        extra = sorted(fixed_set ^ matched)
        bad += [f"{i}@{d}" for i in extra]
        by_id = {r.item_id: r for r in comp}
        for i in extra:
            details.append(_detail(by_id[i], i in fixed_set, side="2x2 only" if i in fixed_set else "matched only"))
        return FAIL, (f"the 2x2's divergent set differs from the matched one on {names(extra)} "
                      f"({len(fixed_set - matched)} in the 2x2 only, {len(matched - fixed_set)} matched only)")
    if len(matched) < th["min_recurring"]:
        return INCONCLUSIVE, (f"{len(matched)} matched divergences on the fixed prefix ids ({len(comp)} units), needs "
                              f"{int(th['min_recurring'])} to observe recurrence")
    return PASS, (f"{recur}/{len(matched)} divergences recur on fresh caches ({len(comp)} units with the same prefix "
                  "ids)")


def _agreement(figs: Mapping[str, Any], high: list[str]) -> tuple[float, float]:
    """The claim's interval: the share of the first high precision's units that agree, between the deciding
    Clopper-Pearson bounds of its disagreement (none without units)."""
    upper, lower = (figs.get(k, {}).get(high[0]) if high else None
                    for k in ("disagreement_upper", "disagreement_lower"))
    return NO_INTERVAL if upper is None or lower is None else (1 - upper, 1 - lower)


def _segments(reason: str, dtypes: list[str]) -> dict[str, str]:
    """A recorded reason cut into its precisions' parts (``"bf16: ...; fp32: ..."``)."""
    marks = sorted((m.start(), d) for d in dtypes for m in re.finditer(rf"(?:^|; ){re.escape(d)}: ", reason))
    out = {}
    for i, (at, d) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else len(reason)
        out[d] = reason[at:end].removeprefix("; ").removeprefix(f"{d}: ")
    return out


def _rejudged(result: Mapping[str, Any], th: Mapping[str, float]) -> tuple[list[str], list[str], dict[str, Any]]:
    """A recorded result's statuses, reasons and figures under today's rule (:meth:`FixedPrefix2x2.rejudge`)."""
    figs = dict(result["figures"])
    dtypes = list(figs["n"])
    high = [d for d in dtypes if d not in LOW_PRECISION]
    old = _segments(result["reason"], dtypes)
    statuses, reasons = [], []
    for d in dtypes:
        if d in LOW_PRECISION:
            k, m = figs.get("recurrence", {}).get(d, [0, 0])
            statuses.append(FAIL if k != m or figs.get("fixed_only", {}).get(d, 0)
                            else INCONCLUSIVE if m < th["min_recurring"] else PASS)
            reasons.append(f"{d}: {old.get(d, '')}")
            continue
        dis = [u.rsplit("@", 1)[0] for u in result.get("counterexamples", []) if u.endswith(f"@{d}")]
        status, why = _high(d, int(figs["disagreements"][d]), int(figs["n"][d]), th, len(high), dis, figs)
        statuses.append(status)
        reasons.append(f"{d}: {why}")
    if len(high) in (0, len(dtypes)):
        statuses.append(INCONCLUSIVE)
        reasons.append("the 2x2 needs a low (bf16/fp16) and a high (fp32) precision in --kvaudit-dtypes")
    figs.update({"confidence": th["confidence"], "max_rate": th["max_rate"]})
    return statuses, reasons, figs


def _detail(r: Any, fixed: bool, **extra: Any) -> dict[str, Any]:
    """A counterexample's two cells: the 2x2's own (replay and prefill on the fixed prefix), or the matched run's."""
    if fixed:
        return detail(r, "fixed:replay", r.fixed["replay"], "fixed:prefill", r.fixed["prefill"], **extra)
    return detail(r, "live", r.constructions["live"], "prefill", r.constructions["prefill"], **extra)


@register
class FixedPrefix2x2(Claim):
    """The 2x2 holds the prefix ids fixed and crosses construction (teacher-forced replay vs one-shot
    prefill, each on a fresh cache) with precision.

    **The fixed prefix** is the first precision's own prefix (``--kvaudit-dtypes``' first entry), id for id,
    for every item where that trajectory reached its boundary. Every precision computes its own two cells
    (``fixed:replay``, ``fixed:prefill``) on those ids, also where its own trajectory was ineligible: the
    2x2 never reuses the matched run's cells, so what it reports is a second observation.

    **High precision** (fp32): its unit is an item with the two fixed cells; the rule is symmetric
    (:func:`pytest_kvaudit.claims.stats.rate_decision`): it passes when the Clopper-Pearson upper bound of the share of
    units whose two suffixes differ is at most ``max_rate``, fails when the Clopper-Pearson lower bound is
    above it, and is inconclusive otherwise, saying how many units it would need (the least n with an upper
    bound at or below ``max_rate``: 183 at 0 disagreements and 2%). Both bounds are Clopper-Pearson's, exact:
    the upper one-sided 97.5%, the lower one-sided 2.5% over the run's high precisions, so each verdict's size,
    and the claim's, is at most 2.5% at every n (``tests/claims/test_decision_rules.py``). The paper's Wilson
    upper bound (1.88% at 0/200) is reported beside it.
    Recurrence at each low precision: see the module's docstring.

    Least evidence: at the high precision the units for the upper bound to clear ``max_rate`` (183 at 2%);
    at each low precision ``min_recurring`` matched divergences (10, donor_following's divergent units: a
    set equality seen on one divergence is no evidence that divergences recur).
    """

    name = "fixed_prefix_2x2"
    exact = True  # lossy cache kinds are skipped, saying so (notes.lossy_note)
    needs = ("trajectory", "prefill", "fixed")
    order = 30
    title = "Fixed-prefix 2x2"
    thresholds = {
        "max_rate": Threshold(0.02, "the high precision's disagreement rate must stay at or below this", "rate"),
        "confidence": Threshold(0.95, "two-sided confidence of the Clopper-Pearson bounds (each one-sided 97.5%; "
                                      "the lower one split over the high precisions)"),
        "min_recurring": Threshold(10, "least matched divergences at each low precision for recurrence to be observed",
                                   "divergent units"),
    }
    evidence = ("a low and a high precision; at the high one, enough fixed-prefix units for the Clopper-Pearson "
                "upper bound to clear max_rate; at each low one, min_recurring matched divergences on the fixed "
                "prefix ids")

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        # None: no number of units clears max_rate (a max_rate of 0)
        return {"units_per_high_precision": least_units_below(thresholds["max_rate"], 0, thresholds["confidence"]),
                "divergent_units_per_low_precision": int(thresholds["min_recurring"])}

    def verdict_chance(self, n: int, discordance: float, thresholds: Mapping[str, float]) -> float | None:
        """P(pass) + P(fail) of the high precision's rate rule on ``n`` units at a true disagreement rate."""
        p, f = rate_chances(n, discordance, thresholds["max_rate"], thresholds["confidence"])
        return float(p + f)

    def strict_needs(self, thresholds: Mapping[str, float], rates: Mapping[str, float]) -> dict[str, int | None]:
        """Items from which the chance that the upper bound clears max_rate stays at least 80% (up to 1,000
        units) at the high precision's calibrated divergence (the 2x2's cells mirror the matched ones), over
        the eligibility rate; none at max_rate."""
        need = units_for_rate(rates.get("divergent_rate_high", 0.0), thresholds["max_rate"], thresholds["confidence"])
        return {"fp32_upper_clears_max_rate": items_for(need, rates)}

    def statistic(self, result: ClaimResult) -> str:
        f = result.figures
        high = ",".join(d for d in f.get("n", {}) if d not in LOW_PRECISION)
        return f"Clopper-Pearson 97.5%, {high} agree"

    def judge(self, ev: Evidence) -> ClaimResult:
        th, records, dtypes = ev.thresholds, ev.records, ev.dtypes
        low = [d for d in dtypes if d in LOW_PRECISION]
        high = [d for d in dtypes if d not in LOW_PRECISION]
        disagreements: dict[str, int] = {}
        units: dict[str, int] = {}
        statuses: list[str] = []
        reasons: list[str] = []
        bad: list[str] = []
        details: list[dict[str, Any]] = []
        figs: dict[str, Any] = {"disagreements": disagreements, "n": units, "prefix_from": dtypes[0],
                                "confidence": th["confidence"], "max_rate": th["max_rate"]}
        for d in dtypes:
            rows = [r for r in records if r.dtype == d and r.fixed]
            units[d] = len(rows)
            dis = [r for r in rows if r.fixed["replay"].suffix != r.fixed["prefill"].suffix]
            disagreements[d] = len(dis)
            if d in LOW_PRECISION:
                status, why = _recurrence(d, rows, th, figs, bad, details, d == dtypes[0])
                statuses.append(status)
                reasons.append(f"{d}: {why}")
            else:
                bad += [f"{r.item_id}@{d}" for r in dis]
                details += [_detail(r, True) for r in dis]
                status, why = _high(d, len(dis), len(rows), th, len(high), [r.item_id for r in dis], figs)
                statuses.append(status)
                reasons.append(f"{d}: {why}")
        if not low or not high:
            statuses.append(INCONCLUSIVE)
            reasons.append("the 2x2 needs a low (bf16/fp16) and a high (fp32) precision in --kvaudit-dtypes")
        n_hi = sum(units[d] for d in high)
        k_hi = n_hi - sum(disagreements[d] for d in high)
        return self.result(combine(statuses), n_hi, k_hi, "; ".join(reasons), figs, bad,
                           interval=_agreement(figs, high),
                           details=details)

    def rejudge(self, result: Mapping[str, Any], thresholds: Mapping[str, float]) -> ClaimResult | None:
        """The high precisions' rates judged again from their recorded counts; each low precision's recurrence (a
        set equality, its rule unchanged) stands as recorded."""
        statuses, reasons, figs = _rejudged(result, thresholds)
        high = [d for d in figs["n"] if d not in LOW_PRECISION]
        return self.result(combine(statuses), result["n"], result["k"], "; ".join(reasons), figs,
                           result.get("counterexamples"), interval=_agreement(figs, high),
                           details=result.get("details"))

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if not f.get("disagreements"):
            return result.reason
        parts = [f"{d}: {v}/{f['n'][d]} disagree" for d, v in f["disagreements"].items()]
        for d, hi in f.get("disagreement_upper", {}).items():
            shown = {PASS: f": {d} disagreement below {f.get('max_rate', 0.02):.0%} (97.5%)"}.get(
                (f.get("verdict") or {}).get(d, ""), "")
            parts.append(f"{d} one-sided 97.5% upper bound " + ("-" if hi is None else f"{hi:.2%}") + shown)
        for d, (k, n) in f.get("recurrence", {}).items():
            excluded = f.get("recurrence_excluded", {}).get(d, 0)
            parts.append(f"{d} recurrence {k}/{n}" + (f" ({excluded} units on another prefix)" if excluded else ""))
        return "; ".join(parts)

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {f"disagreements[{d}]": (int(v), int(figures.get("n", {}).get(d, 0)))
                for d, v in (figures.get("disagreements") or {}).items()}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        fx = result.get("figures", {})
        if not fx.get("disagreements"):
            return None
        up, wil = fx.get("disagreement_upper", {}), fx.get("wilson_upper", {})
        rows = [[d, f"{fx['disagreements'][d]}/{fx['n'][d]}", f"{up[d]:.2%}" if up.get(d) is not None else "-",
                 f"{wil[d]:.2%}" if wil.get(d) is not None else "-",
                 "/".join(map(str, fx.get("recurrence", {}).get(d, []))) or "-",
                 fx.get("recurrence_units", {}).get(d, "-"), fx.get("recurrence_excluded", {}).get(d, "-")]
                for d in fx["disagreements"]]
        return section("2x2", f"{self.title} (prefix ids from {fx.get('prefix_from')})", table(
            ["precision", "replay vs prefill disagreements", "Clopper-Pearson upper bound (one-sided 97.5%, decides)",
             "Wilson upper bound (the paper's figure)",
             "recurrence of matched set", "units on the same prefix ids", "units on another prefix"], rows, "2x2"))
