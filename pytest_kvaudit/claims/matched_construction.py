"""Live cache vs one-shot prefill of the identical ids: suffixes move, and accuracy moves less than the margin.

The rule, per precision, is the equivalence form (:func:`pytest_kvaudit.claims.rules.matched_rule`, its size
proven at every n from 20 to 1,000 pairs in ``benchmarks/decision_rules.py`` and the tests): PASS when Tango's
paired score interval of the accuracy difference lies within ±margin ("accuracy moved less than 6 points
(95%)"), FAIL when it lies wholly outside (at the FAIL level: alpha split over the run's precisions, so the
claim's FAIL size stays at most alpha), inconclusive otherwise, with the items a pass would need. Tango's
interval keeps its width when nothing is discordant, and its z is calibrated so each verdict's size holds. The
exact McNemar p and whether the interval excludes 0 are figures beside the verdict, never the verdict: a move
smaller than the margin is what the claim allows. A model whose labels cannot move (fewer than ``min_each``
items right, or wrong, on either side: all right, all wrong) is inconclusive, never a pass.
Least evidence: ``min_units`` eligible items, answers extracted on both sides of ``min_label_rate`` of them,
and ``min_each`` right and wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.claims.base import (
    NO_INTERVAL,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    combine,
    register,
)
from pytest_kvaudit.claims.counterexample import detail
from pytest_kvaudit.claims.htmlkit import section, table
from pytest_kvaudit.claims.matched_verdict import FIGURES, TEST, decide, decision_figures, shows
from pytest_kvaudit.claims.matched_verdict import rejudge as from_counts
from pytest_kvaudit.claims.notes import ineligible_note
from pytest_kvaudit.claims.power import items_for, matched_chances, units_for_equivalence
from pytest_kvaudit.claims.rules import PROVEN_UP_TO, matched_zs
from pytest_kvaudit.claims.stats import paired_bootstrap_ci, wilson_interval

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.config import AuditConfig


def _figures(rows: list[Any], div: list[Any], th: Mapping[str, float], verdicts: int) -> dict[str, Any]:
    """One precision's counts, intervals, p and power."""
    live = [bool(r.constructions["live"].label) for r in rows]
    pre = [bool(r.constructions["prefill"].label) for r in rows]
    n, conf = len(rows), th["confidence"]
    b = sum(x and not y for x, y in zip(live, pre))
    c = sum(y and not x for x, y in zip(live, pre))
    boot = paired_bootstrap_ci(live, pre, conf, int(th["n_resamples"]), int(th["seed"])) if n else NO_INTERVAL
    f: dict[str, Any] = {
        **decision_figures(n, b, c, sum(live), sum(pre), th, len(div), verdicts),
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


def _points(iv: Any) -> str:
    """An interval of the accuracy difference in points, as the verdict says it ("[+0.1, +5.1]")."""
    lo, hi = list(iv)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"[{lo * 100:+.1f}, {hi * 100:+.1f}]"


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

    def verdict_chance(self, n: int, discordance: float, thresholds: Mapping[str, float]) -> float | None:
        """P(pass) + P(fail) on ``n`` pairs of one precision at a label ``discordance``, accuracy unmoved."""
        p, f = matched_chances(n, discordance, 0.0, thresholds["margin"], thresholds["confidence"])
        return float(p + f)

    def strict_needs(self, thresholds: Mapping[str, float], rates: Mapping[str, float]) -> dict[str, int | None]:
        """To pass under --kvaudit-strict every precision's Tango interval must lie within ±margin: the items
        from which the chance of that, at no true move, stays at least 80% up to 1,000 pairs, at the
        highest divergent-suffix rate of a precision (the calibrated discordance: an upper bound on the label
        discordance), over the eligibility rate."""
        need = units_for_equivalence(rates.get("divergent_rate_max", 1.0), thresholds["margin"],
                                     thresholds["confidence"])
        return {"accuracy_ci_within_margin": items_for(need, rates)}

    def statistic(self, result: ClaimResult) -> str:
        f = result.figures
        first = next(iter(f.get("n", {}) or {}), "")
        shown = f"Tango {f.get('confidence', 0.95):.0%} interval, Δacc {first}"
        return " ".join(shown.split())

    def judge(self, ev: Evidence) -> ClaimResult:
        th, records, dtypes = ev.thresholds, ev.records, ev.dtypes
        figs: dict[str, Any] = {k: {} for k in FIGURES}
        figs["confidence"], figs["margin"] = th["confidence"], th["margin"]
        figs["test"] = TEST
        zp, zf, calibrated = matched_zs(th["margin"], th["confidence"], len(dtypes))
        figs["tango_z"] = {"pass": zp, "fail": zf, "calibrated": calibrated, "verdicts": len(dtypes),
                           "proven_up_to": PROVEN_UP_TO}
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
            f = _figures(rows, div, th, len(dtypes))
            if d == dtypes[0] and rows:
                primary_ci = (f["accuracy_diff_ci"][0], f["accuracy_diff_ci"][1])
            for key, val in f.items():
                figs[key][d] = val
            status, why = decide(f, th, len(dtypes))
            figs["verdict"][d] = status
            statuses.append(status)
            reasons.append(f"{d}: {why}")
        return self.result(combine(statuses), n_all, k_all, "; ".join(reasons) + ineligible_note(records, ev.config),
                           figs,
                           divergent_items, interval=primary_ci, details=details)

    def rejudge(self, result: Mapping[str, Any], thresholds: Mapping[str, float]) -> ClaimResult | None:
        statuses, reason, figs = from_counts(result["figures"], thresholds, result["reason"])
        first = next(iter(figs["n"]), None)
        ci = figs["accuracy_diff_ci"][first] if first else NO_INTERVAL
        return self.result(combine(statuses), result["n"], result["k"], reason, figs, result.get("counterexamples"),
                           interval=(ci[0], ci[1]), details=result.get("details"))

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if not f.get("divergent_suffixes"):
            return result.reason
        return "; ".join(
            f"{d}: {f['divergent_suffixes'][d]}/{f['n'][d]} suffixes, {f['label_disagreements'][d]} labels, "
            + ("Δacc -" if f["accuracy_diff"][d] is None
               else f"Δacc {f['accuracy_diff'][d] * 100:+.1f} points in {_points(f['accuracy_diff_ci'][d])}")
            + shows(f, d)
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

        rows = [[d, f"{mc['divergent_suffixes'][d]}/{mc['n'][d]}",
                 f"{mc['label_disagreements'][d]} of " + ("/".join(map(str, mc.get("labels_extracted", {}).get(d, [])))
                                                          or "-"),
                 f"{num(mc['accuracy_live'][d], '.3f')} / {num(mc['accuracy_prefill'][d], '.3f')}",
                 ("-" if mc["accuracy_diff"][d] is None else f"{mc['accuracy_diff'][d] * 100:+.1f} ")
                 + _points(mc["accuracy_diff_ci"][d]),
                 num((mc.get("mcnemar_p") or {}).get(d), ".3g"),
                 num((mc.get("pass_chance_at_zero") or {}).get(d), ".0%") + " / "
                 + num((mc.get("pass_chance_at_divergence") or {}).get(d), ".0%"),
                 shows(mc, d).lstrip(": ") or "-"]
                for d in mc["divergent_suffixes"]]
        return section("matched", self.title, table(
            ["precision", "divergent suffixes", "label changes of extracted", "accuracy live / prefill",
             f"Δ points, Tango {mc.get('confidence', 0.95):.0%}", "McNemar p", "P(pass), no move: labels / suffixes",
             "the rule shows"], rows, "matched"))
