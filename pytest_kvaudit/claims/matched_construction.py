"""Live cache vs one-shot prefill of the identical ids: suffixes move, accuracy does not."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..htmlkit import section, table
from ..stats import mcnemar_exact, paired_bootstrap_ci
from .base import FAIL, INCONCLUSIVE, PASS, Claim, ClaimResult, Evidence, Threshold, combine, ineligible_note, register

if TYPE_CHECKING:
    from ..config import AuditConfig


def _iv(iv: Any) -> str:
    lo, hi = list(iv)
    return f"[{lo:.3f}, {hi:.3f}]"


@register
class MatchedConstruction(Claim):
    name = "matched_construction"
    order = 20
    title = "Matched experiment: live vs prefill of identical ids"
    thresholds = {
        "min_units": Threshold(20, "least eligible items per precision", "items"),
        "margin": Threshold(0.06, "the accuracy difference's CI must lie within ±margin to pass", "accuracy"),
        "confidence": Threshold(0.95, "confidence of the paired bootstrap interval"),
        "n_resamples": Threshold(10000, "bootstrap resamples", "resamples"),
        "seed": Threshold(0, "bootstrap seed (default: --kvaudit-seed)"),
    }
    evidence = "min_units eligible items per precision, live and prefill labels for each"

    def defaults(self, config: AuditConfig) -> dict[str, float]:
        return {**super().defaults(config), "seed": float(config.seed)}

    def judge(self, ev: Evidence) -> ClaimResult:
        th, records, dtypes = ev.thresholds, ev.records, ev.dtypes
        figs: dict[str, dict[str, Any]] = {
            k: {} for k in ("divergent_suffixes", "label_disagreements", "accuracy_live", "accuracy_prefill",
                            "accuracy_diff", "accuracy_diff_ci", "mcnemar_p", "n")
        }
        statuses, reasons, divergent_items = [], [], []
        n_all = k_all = 0
        primary_ci: tuple[float, float] = (float("-inf"), float("inf"))
        for d in dtypes:
            rows = [r for r in records if r.dtype == d and r.eligible]
            live = [bool(r.constructions["live"].label) for r in rows]
            pre = [bool(r.constructions["prefill"].label) for r in rows]
            div = [r.item_id for r in rows if r.constructions["live"].suffix != r.constructions["prefill"].suffix]
            n = len(rows)
            n_all += n
            k_all += n - len(div)
            divergent_items += [f"{i}@{d}" for i in div]
            ci = paired_bootstrap_ci(live, pre, th["confidence"], int(th["n_resamples"]), int(th["seed"])) if n else (
                float("-inf"), float("inf"))
            if d == dtypes[0]:
                primary_ci = ci
            acc_l = sum(live) / n if n else 0.0
            acc_p = sum(pre) / n if n else 0.0
            f = {"divergent_suffixes": len(div), "label_disagreements": sum(a != b for a, b in zip(live, pre)),
                 "accuracy_live": acc_l, "accuracy_prefill": acc_p, "accuracy_diff": acc_l - acc_p,
                 "accuracy_diff_ci": [ci[0], ci[1]], "mcnemar_p": mcnemar_exact(live, pre) if n else 1.0, "n": n}
            for key, val in f.items():
                figs[key][d] = val
            m = th["margin"]
            if n < th["min_units"]:
                statuses.append(INCONCLUSIVE)
                reasons.append(f"{d}: {n} eligible items, needs {int(th['min_units'])}")
            elif ci[0] > 0 or ci[1] < 0:
                statuses.append(FAIL)
                reasons.append(f"{d}: accuracy differs, diff {acc_l - acc_p:+.3f} CI [{ci[0]:+.3f}, {ci[1]:+.3f}] excludes 0")
            elif -m <= ci[0] and ci[1] <= m:
                statuses.append(PASS)
                reasons.append(f"{d}: {len(div)}/{n} suffixes diverge, accuracy diff CI [{ci[0]:+.3f}, {ci[1]:+.3f}] within ±{m:g}")
            else:
                statuses.append(INCONCLUSIVE)
                reasons.append(f"{d}: accuracy diff CI [{ci[0]:+.3f}, {ci[1]:+.3f}] wider than ±{m:g}")
        return self.result(combine(statuses), n_all, k_all, "; ".join(reasons) + ineligible_note(records), figs,
                           divergent_items, interval=primary_ci)

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if not f.get("divergent_suffixes"):
            return result.reason
        return "; ".join(
            f"{d}: {f['divergent_suffixes'][d]}/{f['n'][d]} suffixes, {f['label_disagreements'][d]} labels, "
            f"Δacc {f['accuracy_diff'][d]:+.3f} CI {_iv(f['accuracy_diff_ci'][d])}"
            for d in f["divergent_suffixes"]
        )

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {f"divergent_suffixes[{d}]": (int(v), int(figures.get("n", {}).get(d, 0)))
                for d, v in (figures.get("divergent_suffixes") or {}).items()}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        mc = result.get("figures", {})
        if not mc.get("divergent_suffixes"):
            return None
        rows = [[d, f"{mc['divergent_suffixes'][d]}/{mc['n'][d]}", mc["label_disagreements"][d],
                 f"{mc['accuracy_live'][d]:.3f}", f"{mc['accuracy_prefill'][d]:.3f}", f"{mc['accuracy_diff'][d]:+.3f}",
                 f"[{mc['accuracy_diff_ci'][d][0]:+.3f}, {mc['accuracy_diff_ci'][d][1]:+.3f}]"]
                for d in mc["divergent_suffixes"]]
        return section("matched", self.title, table(
            ["precision", "divergent suffixes", "label disagreements", "accuracy live", "accuracy prefill", "Δ",
             "paired 95% CI"], rows, "matched"))
