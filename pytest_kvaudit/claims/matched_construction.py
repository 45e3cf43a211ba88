"""Live cache vs one-shot prefill of the identical ids: suffixes move, accuracy does not."""

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
from pytest_kvaudit.claims.stats import mcnemar_exact, paired_bootstrap_ci, paired_units_for_margin, wilson_interval

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.config import AuditConfig


def _iv(iv: Any) -> str:
    lo, hi = list(iv)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    return f"[{lo:+.3f}, {hi:+.3f}]"


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
        "margin": Threshold(0.06, "the accuracy difference's CI must lie within ±margin to pass", "accuracy"),
        "confidence": Threshold(0.95, "confidence of the paired bootstrap interval"),
        "n_resamples": Threshold(10000, "bootstrap resamples", "resamples"),
        "seed": Threshold(0, "bootstrap seed (default: --kvaudit-seed)"),
    }
    evidence = ("min_units eligible items per precision, and an answer extracted from both the live and the prefill "
                "continuation on at least min_label_rate of them")

    def defaults(self, config: AuditConfig) -> dict[str, float]:
        return {**super().defaults(config), "seed": float(config.seed)}

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"eligible_items_per_precision": int(thresholds["min_units"]),
                "label_rate": float(thresholds["min_label_rate"])}

    def strict_needs(self, thresholds: Mapping[str, float], rates: Mapping[str, float]) -> dict[str, int | None]:
        """To pass, the accuracy difference's CI must lie within ±margin at every precision: at most the
        precisions' highest divergent-suffix rate of pairs can disagree on their label, so the items (eligible
        ones, over the eligibility rate) that CI's width needs at that discordance."""
        need = paired_units_for_margin(thresholds["margin"], rates.get("divergent_rate_max", 1.0), thresholds["confidence"])
        eligible = rates.get("eligible_items_per_precision", 1.0)
        return {"accuracy_ci_within_margin": None if need is None or eligible <= 0 else math.ceil(need / eligible - 1e-9)}

    def statistic(self, result: ClaimResult) -> str:
        f = result.figures
        first = next(iter(f.get("n", {}) or {}), "")
        return f"bootstrap {f.get('confidence', 0.95):.0%} CI Δacc {first}".rstrip()

    def judge(self, ev: Evidence) -> ClaimResult:
        th, records, dtypes = ev.thresholds, ev.records, ev.dtypes
        figs: dict[str, Any] = {
            k: {} for k in ("divergent_suffixes", "label_disagreements", "accuracy_live", "accuracy_prefill",
                            "accuracy_diff", "accuracy_diff_ci", "mcnemar_p", "n", "labels_extracted", "discordant",
                            "answer_changes", "rate_ci")
        }
        figs["confidence"] = th["confidence"]
        statuses, reasons, divergent_items, details = [], [], [], []
        n_all = k_all = 0
        primary_ci: tuple[float, float] = NO_INTERVAL
        for d in dtypes:
            rows = [r for r in records if r.dtype == d and r.eligible]
            live = [bool(r.constructions["live"].label) for r in rows]
            pre = [bool(r.constructions["prefill"].label) for r in rows]
            extracted = sum(r.constructions["live"].answer is not None and r.constructions["prefill"].answer is not None
                            for r in rows)
            div = [r for r in rows if r.constructions["live"].suffix != r.constructions["prefill"].suffix]
            n = len(rows)
            n_all += n
            k_all += n - len(div)
            divergent_items += [f"{r.item_id}@{d}" for r in div]
            details += [detail(r, "live", r.constructions["live"], "prefill", r.constructions["prefill"],
                               label_a=r.constructions["live"].label, label_b=r.constructions["prefill"].label)
                        for r in div]
            ci = paired_bootstrap_ci(live, pre, th["confidence"], int(th["n_resamples"]), int(th["seed"])) if n else (
                NO_INTERVAL)
            if d == dtypes[0]:
                primary_ci = ci
            acc_l = sum(live) / n if n else None
            acc_p = sum(pre) / n if n else None
            f: dict[str, Any] = {"divergent_suffixes": len(div), "label_disagreements": sum(a != b for a, b in zip(live, pre)),
                 "accuracy_live": acc_l, "accuracy_prefill": acc_p,
                 "accuracy_diff": None if acc_l is None or acc_p is None else acc_l - acc_p,
                 "accuracy_diff_ci": [ci[0], ci[1]], "mcnemar_p": mcnemar_exact(live, pre) if n else None, "n": n,
                 "labels_extracted": [extracted, n],
                 "discordant": [sum(a and not b for a, b in zip(live, pre)), sum(b and not a for a, b in zip(live, pre))],
                 # the extracted answer itself: a model that is wrong on both sides changes no label, yet a
                 # divergent suffix may still change what it answers (a label is correctness, not the answer)
                 "answer_changes": sum(r.constructions["live"].answer != r.constructions["prefill"].answer for r in div)}
            # Wilson intervals of the three rates over the eligible items: what a run of this size can say of them
            f["rate_ci"] = {k: list(wilson_interval(int(f[k]), n, th["confidence"])) if n else None
                            for k in ("divergent_suffixes", "label_disagreements", "answer_changes")}
            for key, val in f.items():
                figs[key][d] = val
            m, need = th["margin"], th["min_label_rate"]
            if n < th["min_units"]:
                statuses.append(INCONCLUSIVE)
                reasons.append(f"{d}: {n} eligible items, needs {int(th['min_units'])}")
            elif extracted < need * n:
                statuses.append(INCONCLUSIVE)
                reasons.append(f"{d}: an answer extracted on both sides for {extracted}/{n} eligible items "
                               f"({extracted / n:.0%}), needs {need:.0%} ({math.ceil(need * n)}): check the answer regex")
            elif ci[0] > 0 or ci[1] < 0:
                statuses.append(FAIL)
                reasons.append(f"{d}: accuracy differs, diff {f['accuracy_diff']:+.3f} CI {_iv(ci)} excludes 0")
            elif -m <= ci[0] and ci[1] <= m:
                statuses.append(PASS)
                reasons.append(f"{d}: {len(div)}/{n} suffixes diverge ({f['answer_changes']} with another answer), "
                               f"accuracy diff CI {_iv(ci)} within ±{m:g}")
            else:
                statuses.append(INCONCLUSIVE)
                reasons.append(f"{d}: accuracy diff CI {_iv(ci)} wider than ±{m:g}")
        return self.result(combine(statuses), n_all, k_all, "; ".join(reasons) + ineligible_note(records, ev.config), figs,
                           divergent_items, interval=primary_ci, details=details)

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if not f.get("divergent_suffixes"):
            return result.reason
        return "; ".join(
            f"{d}: {f['divergent_suffixes'][d]}/{f['n'][d]} suffixes, {f['label_disagreements'][d]} labels, "
            + ("Δacc -" if f["accuracy_diff"][d] is None else f"Δacc {f['accuracy_diff'][d]:+.3f} CI {_iv(f['accuracy_diff_ci'][d])}")
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
                 num(mc["accuracy_diff"][d], "+.3f"), _iv(mc["accuracy_diff_ci"][d])]
                for d in mc["divergent_suffixes"]]
        return section("matched", self.title, table(
            ["precision", "divergent suffixes", "label disagreements", "labels extracted", "accuracy live",
             "accuracy prefill", "Δ", "paired 95% CI"], rows, "matched"))
