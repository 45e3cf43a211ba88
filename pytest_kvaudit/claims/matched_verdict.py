"""matched_construction's verdict from its counts alone: the figures the rule reads and reports, the verdict and its
words. The claim judges a run's records with it, and :meth:`MatchedConstruction.rejudge` re-renders a committed
report from the counts it recorded, so both say the same of the same table."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.base import FAIL, INCONCLUSIVE, NO_INTERVAL, PASS
from pytest_kvaudit.claims.power import matched_chances, units_for_equivalence
from pytest_kvaudit.claims.rules import PROVEN_UP_TO, matched_rule, matched_zs
from pytest_kvaudit.claims.stats import mcnemar_counts, tango_interval, wilson_interval

#: the per-precision figures (DESIGN's first six, never renamed; the rest added by issues 37 and 45)
FIGURES = ("divergent_suffixes", "label_disagreements", "accuracy_live", "accuracy_prefill", "accuracy_diff",
           "accuracy_diff_ci", "accuracy_diff_ci_bootstrap", "mcnemar_p", "n", "labels_extracted", "discordant",
           "answer_changes", "rate_ci", "right_wrong", "pass_chance_at_zero", "items_for_pass", "verdict",
           "accuracy_diff_ci_fail", "excludes_zero", "discordance", "pass_chance_at_divergence")
TEST = ("equivalence: PASS when Tango's paired score interval (95%, z calibrated) lies within ±margin, FAIL when "
        "it lies wholly outside (alpha split over the precisions), else inconclusive; the exact McNemar p is a figure")


def _pts(x: float) -> str:
    return f"{x * 100:+.1f}"


def decision_figures(n: int, b: int, c: int, right_live: int, right_prefill: int, th: Mapping[str, float],
                     divergent: int, verdicts: int = 1) -> dict[str, Any]:
    """The figures the rule reads and reports, from counts alone: ``n`` pairs, ``b`` right only live, ``c`` only
    with prefill, each side's right answers, the ``divergent`` suffixes and the run's ``verdicts`` (precisions)
    that split the FAIL alpha (``benchmarks/rejudge.py`` re-renders committed reports with it)."""
    conf, m = th["confidence"], th["margin"]
    zp, zf, _ = matched_zs(m, conf, verdicts)
    acc_l, acc_p = (right_live / n, right_prefill / n) if n else (None, None)
    ci = tango_interval(b, c, n, z=zp) if n else NO_INTERVAL
    wide = tango_interval(b, c, n, z=zf) if n else NO_INTERVAL
    disc, div = ((b + c) / n, divergent / n) if n else (0.0, 0.0)
    return {
        "n": n, "label_disagreements": b + c, "discordant": [b, c], "accuracy_live": acc_l, "accuracy_prefill": acc_p,
        "accuracy_diff": None if acc_l is None or acc_p is None else acc_l - acc_p, "accuracy_diff_ci": [ci[0], ci[1]],
        "accuracy_diff_ci_fail": [wide[0], wide[1]], "mcnemar_p": mcnemar_counts(b, c) if n else None,
        "excludes_zero": bool(n) and (ci[0] > 0 or ci[1] < 0),
        "right_wrong": [min(right_live, right_prefill), n - max(right_live, right_prefill)],
        # the chance to pass at no true move, at a named discordance: the observed label discordance,
        # and the divergent-suffix rate (what the plan calibrates on: labels differ only where suffixes do)
        "discordance": {"labels_observed": disc, "suffixes_observed": div},
        "pass_chance_at_zero": matched_chances(n, disc, 0.0, m, conf)[0] if n else None,
        "pass_chance_at_divergence": matched_chances(n, div, 0.0, m, conf)[0] if n else None,
        "items_for_pass": units_for_equivalence(div, m, conf) if n else None}


def _chances(f: Mapping[str, Any]) -> str:
    d = f["discordance"]
    return (f"chance to pass at no move {f['pass_chance_at_zero']:.0%} at the observed label discordance "
            f"{d['labels_observed']:.1%}, {f['pass_chance_at_divergence']:.0%} at the observed divergent-suffix rate "
            f"{d['suffixes_observed']:.1%}")


def decide(f: Mapping[str, Any], th: Mapping[str, float], verdicts: int = 1) -> tuple[str, str]:
    """One precision's verdict and its reason: least evidence, labels that can move, then the rule."""
    n, (ext, _), (b, c), (right, wrong) = f["n"], f["labels_extracted"], f["discordant"], f["right_wrong"]
    m, need, conf = th["margin"], th["min_label_rate"], th["confidence"]
    if n < th["min_units"]:
        return INCONCLUSIVE, f"{n} eligible items, needs {int(th['min_units'])}"
    if ext < need * n:
        return INCONCLUSIVE, (f"an answer extracted on both sides for {ext}/{n} eligible items ({ext / n:.0%}), "
                              f"needs {need:.0%} ({math.ceil(need * n)}): check the answer regex")
    if right < th["min_each"] or wrong < th["min_each"]:
        return INCONCLUSIVE, (f"labels cannot move: {right} items right and {wrong} wrong on the side with fewer, "
                              f"needs {int(th['min_each'])} of each")
    passes, fails = (bool(x) for x in matched_rule(b, c, n, m, conf, verdicts))
    zp, zf, calibrated = matched_zs(m, conf, verdicts)
    lo, hi = f["accuracy_diff_ci"]
    moved = (f"moved {_pts(f['accuracy_diff'])} points (exact McNemar p = {f['mcnemar_p']:.3g}), {b}:{c} discordant "
             f"labels, Tango interval [{_pts(lo)}, {_pts(hi)}]" + (" excludes 0" if f["excludes_zero"] else ""))
    proof = "" if calibrated else "; z nominal, its size proven only for the default margin and confidence"
    if passes:
        return PASS, (f"accuracy moved less than {m * 100:g} points ({conf:.0%}): {moved}, within ±{m * 100:g}; "
                      f"{f['divergent_suffixes']}/{n} suffixes diverge ({f['answer_changes']} with another answer); "
                      f"{_chances(f)}{proof}")
    if fails:
        wl, wh = f["accuracy_diff_ci_fail"]
        return FAIL, (f"accuracy moved more than {m * 100:g} points ({conf:.0%}): {moved}; at the FAIL level "
                      f"(alpha split over {verdicts} precision{'s' if verdicts > 1 else ''}, z = {zf:g}) "
                      f"[{_pts(wl)}, {_pts(wh)}], wholly outside ±{m * 100:g}{proof}")
    more = f["items_for_pass"]
    return INCONCLUSIVE, (f"{moved}: not shown within ±{m * 100:g} (nor wholly outside); {_chances(f)}; "
                          + (f"an 80% chance to pass needs {more} eligible items at the observed divergent-suffix "
                             f"rate" if more else f"no n up to {PROVEN_UP_TO:,} gets an 80% chance to pass"))


def shows(f: Mapping[str, Any], d: str) -> str:
    """What one precision's verdict shows, in the claim's words (empty for a report without verdicts)."""
    v = (f.get("verdict") or {}).get(d)
    m = (f.get("margin") or 0.06) * 100
    conf = f.get("confidence", 0.95)
    return {PASS: f": accuracy moved less than {m:g} points ({conf:.0%})",
            FAIL: f": accuracy moved more than {m:g} points ({conf:.0%})",
            INCONCLUSIVE: ": not shown within the margin"}.get(v or "", "")




def rejudge(figures: Mapping[str, Any], th: Mapping[str, float], reason: str) -> tuple[list[str], str, dict[str, Any]]:
    """A recorded result's per-precision verdicts, reason and figures under today's rule, from its counts: each
    precision's pairs, discordant labels, accuracies, divergent suffixes, extracted labels and answer changes; the
    bootstrap interval carried (a figure of the records, never deciding); the reason's ineligible note kept."""
    figs: dict[str, Any] = {k: {} for k in FIGURES}
    for k, v in figures.items():
        if k not in FIGURES:
            figs[k] = v
    dtypes = list(figures["n"])
    statuses, parts = [], []
    for d in dtypes:
        n = int(figures["n"][d])
        b, c = (int(x) for x in figures["discordant"][d])
        right = [round((figures[k][d] or 0.0) * n) for k in ("accuracy_live", "accuracy_prefill")]
        f = {**decision_figures(n, b, c, right[0], right[1], th, int(figures["divergent_suffixes"][d]), len(dtypes)),
             "divergent_suffixes": int(figures["divergent_suffixes"][d]),
             # rules 1 decided on the bootstrap and recorded it as accuracy_diff_ci
             "accuracy_diff_ci_bootstrap": figures.get("accuracy_diff_ci_bootstrap", figures["accuracy_diff_ci"])[d],
             "labels_extracted": figures.get("labels_extracted", {}).get(d, [n, n]),
             "answer_changes": int(figures.get("answer_changes", {}).get(d, 0))}
        f["rate_ci"] = {k: list(wilson_interval(int(f[k]), n, th["confidence"])) if n else None
                        for k in ("divergent_suffixes", "label_disagreements", "answer_changes")}
        status, why = decide(f, th, len(dtypes))
        f["verdict"] = status
        for k, v in f.items():
            figs[k][d] = v
        statuses.append(status)
        parts.append(f"{d}: {why}")
    zp, zf, calibrated = matched_zs(th["margin"], th["confidence"], len(dtypes))
    figs.update({"confidence": th["confidence"], "margin": th["margin"], "test": TEST,
                 "tango_z": {"pass": zp, "fail": zf, "calibrated": calibrated, "verdicts": len(dtypes),
                             "proven_up_to": PROVEN_UP_TO}})
    note = re.search(r" \(ineligible: [^()]*(?:\([^()]*\)[^()]*)*\)$", reason)
    return statuses, "; ".join(parts) + (note.group(0) if note else ""), figs
