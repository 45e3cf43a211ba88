"""Live cache vs one-shot prefill of the identical ids: suffixes move, accuracy does not.

The rule, per precision (:func:`pytest_kvaudit.claims.power.matched_rule`, its size proven in
``tests/claims/test_decision_rules.py``): FAIL when the exact conditional McNemar test (two-sided, alpha =
1 - confidence) says accuracy moved, even inside the margin; PASS when Tango's paired score interval (two-sided
95%, so two one-sided tests at 2.5%) lies within ±margin, an interval that keeps its width when nothing is
discordant; otherwise inconclusive, with the items a pass would need. A model whose labels cannot move (fewer
than ``min_each`` items right, or wrong, on either side: all right, all wrong) is inconclusive, never a pass.
Least evidence: ``min_units`` eligible items, answers extracted on both sides of ``min_label_rate`` of them,
and ``min_each`` right and wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

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
    register,
)
from pytest_kvaudit.claims.counterexample import detail
from pytest_kvaudit.claims.htmlkit import section, table
from pytest_kvaudit.claims.notes import ineligible_note
from pytest_kvaudit.claims.power import items_for, matched_chances, units_for_equivalence
from pytest_kvaudit.claims.stats import mcnemar_counts, paired_bootstrap_ci, tango_interval, wilson_interval

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.config import AuditConfig


def _iv(iv: Any) -> str:
    lo, hi = list(iv)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"[{lo:+.3f}, {hi:+.3f}]"


#: the per-precision figures (DESIGN's first six, never renamed; the rest added by issue 37)
FIGURES = ("divergent_suffixes", "label_disagreements", "accuracy_live", "accuracy_prefill", "accuracy_diff",
           "accuracy_diff_ci", "accuracy_diff_ci_bootstrap", "mcnemar_p", "n", "labels_extracted", "discordant",
           "answer_changes", "rate_ci", "right_wrong", "pass_chance_at_zero", "power_at_margin", "items_for_pass")
TEST = ("FAIL: exact conditional McNemar, two-sided, alpha = 1 - confidence; PASS: Tango's paired score interval, "
        "two-sided (each end a one-sided test at half alpha), within ±margin")


def decision_figures(n: int, b: int, c: int, right_live: int, right_prefill: int,
                     th: Mapping[str, float]) -> dict[str, Any]:
    """The figures the rule reads, from counts alone: ``n`` pairs, ``b`` right only live, ``c`` only with
    prefill, and each side's right answers (``benchmarks/rejudge.py`` re-judges committed reports with it)."""
    conf, m = th["confidence"], th["margin"]
    acc_l, acc_p = (right_live / n, right_prefill / n) if n else (None, None)
    ci = tango_interval(b, c, n, conf) if n else NO_INTERVAL
    disc = (b + c) / n if n else 0.0
    return {
        "n": n, "label_disagreements": b + c, "discordant": [b, c], "accuracy_live": acc_l, "accuracy_prefill": acc_p,
        "accuracy_diff": None if acc_l is None or acc_p is None else acc_l - acc_p, "accuracy_diff_ci": [ci[0], ci[1]],
        "mcnemar_p": mcnemar_counts(b, c) if n else None,
        "right_wrong": [min(right_live, right_prefill), n - max(right_live, right_prefill)],
        # what this n could tell: the chance to pass if accuracy does not move, at the discordance seen, and
        # McNemar's power against a move of the margin (at least the margin's share of pairs discordant)
        "pass_chance_at_zero": matched_chances(n, disc, 0.0, m, conf)[0] if n else None,
        "power_at_margin": matched_chances(n, max(disc, m), m, m, conf)[1] if n else None,
        "items_for_pass": units_for_equivalence(disc, m, conf) if n else None}


def _figures(rows: list[Any], div: list[Any], th: Mapping[str, float]) -> dict[str, Any]:
    """One precision's counts, intervals, p and power."""
    live = [bool(r.constructions["live"].label) for r in rows]
    pre = [bool(r.constructions["prefill"].label) for r in rows]
    n, conf = len(rows), th["confidence"]
    b = sum(x and not y for x, y in zip(live, pre))
    c = sum(y and not x for x, y in zip(live, pre))
    boot = paired_bootstrap_ci(live, pre, conf, int(th["n_resamples"]), int(th["seed"])) if n else NO_INTERVAL
    f: dict[str, Any] = {
        **decision_figures(n, b, c, sum(live), sum(pre), th),
        "divergent_suffixes": len(div), "accuracy_diff_ci_bootstrap": [boot[0], boot[1]],
        "labels_extracted": [sum(r.constructions["live"].answer is not None
                                 and r.constructions["prefill"].answer is not None
                                 for r in rows), n],
        # the extracted answer itself: a model that is wrong on both sides changes no label, yet a divergent
        # suffix may still change what it answers (a label is correctness, not the answer)
        "answer_changes": sum(r.constructions["live"].answer != r.constructions["prefill"].answer for r in div)}
    # Wilson intervals of the three rates over the eligible items: what a run of this size can say of them
    f["rate_ci"] = {k: list(wilson_interval(int(f[k]), n, conf)) if n else None
                    for k in ("divergent_suffixes", "label_disagreements", "answer_changes")}
    return f


def decide(f: Mapping[str, Any], th: Mapping[str, float]) -> tuple[str, str]:
    """One precision's verdict and its reason, in the order of :data:`TEST`."""
    n, (ext, _), (b, c), (right, wrong) = f["n"], f["labels_extracted"], f["discordant"], f["right_wrong"]
    m, need, alpha = th["margin"], th["min_label_rate"], 1 - th["confidence"]
    ci, p = f["accuracy_diff_ci"], f["mcnemar_p"]
    if n < th["min_units"]:
        return INCONCLUSIVE, f"{n} eligible items, needs {int(th['min_units'])}"
    if ext < need * n:
        return INCONCLUSIVE, (f"an answer extracted on both sides for {ext}/{n} eligible items ({ext / n:.0%}), "
                              f"needs {need:.0%} ({math.ceil(need * n)}): check the answer regex")
    stats = (f"{b}:{c} discordant labels, exact McNemar p = {p:.3g}, Tango {th['confidence']:.0%} CI {_iv(ci)}, "
             f"power {f['power_at_margin']:.0%} against a move of {m:g}")
    if p < alpha:
        return FAIL, f"accuracy moved: diff {f['accuracy_diff']:+.3f}; {stats}"
    if right < th["min_each"] or wrong < th["min_each"]:
        return INCONCLUSIVE, (f"labels cannot move: {right} items right and {wrong} wrong on the side with fewer, "
                              f"needs {int(th['min_each'])} of each")
    if -m <= ci[0] and ci[1] <= m:
        return PASS, (f"{f['divergent_suffixes']}/{n} suffixes diverge ({f['answer_changes']} with another answer), "
                      f"accuracy diff {f['accuracy_diff']:+.3f} within ±{m:g}; {stats}")
    more = f["items_for_pass"]
    return INCONCLUSIVE, (f"accuracy diff {f['accuracy_diff']:+.3f} not shown within ±{m:g}; {stats}; "
                          + (f"an 80% chance to pass needs {more} eligible items" if more else "no n gets there"))


@register
class MatchedConstruction(Claim):
    name = "matched_construction"
    exact = True  # lossy cache kinds are skipped, saying so (notes.lossy_note)
    needs = ("trajectory", "prefill")
    order = 20
    title = "Matched experiment: live vs prefill of identical ids"
    thresholds = {
        "min_units": Threshold(20, "least eligible items per precision", "items"),
        "min_label_rate": Threshold(0.8, "least share of eligible items whose answer is extracted on both sides",
                                    "rate"),
        "min_each": Threshold(10, "least items right, and least wrong, on each side: labels that can move", "items"),
        "margin": Threshold(0.06, "Tango's interval of the accuracy difference must lie within ±margin to pass",
                            "accuracy"),
        "confidence": Threshold(0.95, "confidence of Tango's interval; 1 - confidence is McNemar's alpha"),
        "n_resamples": Threshold(10000, "resamples of the paper's bootstrap interval (reported, never deciding)",
                                 "resamples"),
        "seed": Threshold(0, "bootstrap seed (default: --kvaudit-seed)"),
    }
    evidence = ("min_units eligible items per precision, an answer extracted from both the live and the prefill "
                "continuation on at least min_label_rate of them, and min_each items right and wrong on each side")

    def defaults(self, config: AuditConfig) -> dict[str, float]:
        return {**super().defaults(config), "seed": float(config.seed)}

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"eligible_items_per_precision": int(thresholds["min_units"]),
                "label_rate": float(thresholds["min_label_rate"]),
                # labels that can move (min_each): a model right on every item is never judged, at any n
                "right_items_per_side": int(thresholds["min_each"]),
                "wrong_items_per_side": int(thresholds["min_each"])}

    def strict_needs(self, thresholds: Mapping[str, float], rates: Mapping[str, float]) -> dict[str, int | None]:
        """To pass under --kvaudit-strict every precision's Tango interval must lie within ±margin: the items
        for an 80% chance of that when accuracy does not move, at the highest divergent-suffix rate of a
        precision (an upper bound on the label discordance), over the eligibility rate."""
        need = units_for_equivalence(rates.get("divergent_rate_max", 1.0), thresholds["margin"],
                                     thresholds["confidence"])
        return {"accuracy_ci_within_margin": items_for(need, rates)}

    def statistic(self, result: ClaimResult) -> str:
        f = result.figures
        first = next(iter(f.get("n", {}) or {}), "")
        return f"exact McNemar; Tango {f.get('confidence', 0.95):.0%} CI Δacc {first}".rstrip()

    def judge(self, ev: Evidence) -> ClaimResult:
        th, records, dtypes = ev.thresholds, ev.records, ev.dtypes
        figs: dict[str, Any] = {k: {} for k in FIGURES}
        figs["confidence"] = th["confidence"]
        figs["test"] = TEST
        statuses, reasons, divergent_items, details = [], [], [], []
        n_all = k_all = 0
        primary_ci: tuple[float, float] = NO_INTERVAL
        for d in dtypes:
            rows = [r for r in records if r.dtype == d and r.eligible]
            div = [r for r in rows if r.constructions["live"].suffix != r.constructions["prefill"].suffix]
            n_all += len(rows)
            k_all += len(rows) - len(div)
            divergent_items += [f"{r.item_id}@{d}" for r in div]
            details += [detail(r, "live", r.constructions["live"], "prefill", r.constructions["prefill"],
                               label_a=r.constructions["live"].label, label_b=r.constructions["prefill"].label)
                        for r in div]
            f = _figures(rows, div, th)
            if d == dtypes[0] and rows:
                primary_ci = (f["accuracy_diff_ci"][0], f["accuracy_diff_ci"][1])
            for key, val in f.items():
                figs[key][d] = val
            status, why = decide(f, th)
            statuses.append(status)
            reasons.append(f"{d}: {why}")
        return self.result(combine(statuses), n_all, k_all, "; ".join(reasons) + ineligible_note(records, ev.config),
                           figs,
                           divergent_items, interval=primary_ci, details=details)

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if not f.get("divergent_suffixes"):
            return result.reason
        return "; ".join(
            f"{d}: {f['divergent_suffixes'][d]}/{f['n'][d]} suffixes, {f['label_disagreements'][d]} labels, "
            + ("Δacc -" if f["accuracy_diff"][d] is None
               else f"Δacc {f['accuracy_diff'][d]:+.3f} CI {_iv(f['accuracy_diff_ci'][d])}")
            for d in f["divergent_suffixes"]
        )

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {f"divergent_suffixes[{d}]": (int(v), int(figures.get("n", {}).get(d, 0)))
                for d, v in (figures.get("divergent_suffixes") or {}).items()}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        mc = result.get("figures", {})
        if not mc.get("divergent_suffixes"):
            return None
        def num(x: Any, fmt: str) -> str:
            return "-" if x is None else format(x, fmt)

        rows = [[d, f"{mc['divergent_suffixes'][d]}/{mc['n'][d]}", mc["label_disagreements"][d],
                 "/".join(map(str, mc.get("labels_extracted", {}).get(d, []))) or "-",
                 num(mc["accuracy_live"][d], ".3f"), num(mc["accuracy_prefill"][d], ".3f"),
                 num(mc["accuracy_diff"][d], "+.3f"), _iv(mc["accuracy_diff_ci"][d]),
                 num((mc.get("mcnemar_p") or {}).get(d), ".3g"), num((mc.get("power_at_margin") or {}).get(d), ".0%")]
                for d in mc["divergent_suffixes"]]
        return section("matched", self.title, table(
            ["precision", "divergent suffixes", "label disagreements", "labels extracted", "accuracy live",
             "accuracy prefill", "Δ", "Tango 95% CI (two-sided)", "exact McNemar p", "power against ±margin"], rows,
            "matched"))
