"""The claims' pass rules: store records + thresholds -> pass / fail / inconclusive, with figures.

Exactness claims fail on one counterexample and name it. A claim with fewer eligible units than it
needs is *inconclusive*, never a pass. Every verdict carries n (units judged), k (units where the
property holds) and a 95% interval: Wilson for proportions, a paired percentile bootstrap for
accuracy differences. Pure functions, no pytest: claims can be judged from a saved store export.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import LOW_PRECISION
from .stats import mcnemar_exact, paired_bootstrap_ci, wilson_interval
from .store import CellRecord

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"

#: every claim's thresholds and their defaults; a marker or an ini line overrides any of them
DEFAULTS: dict[str, dict[str, float]] = {
    "replica_exactness": {"min_units": 12},
    "matched_construction": {"min_units": 20, "margin": 0.06, "confidence": 0.95, "n_resamples": 10000, "seed": 0},
    "fixed_prefix_2x2": {"min_units": 20, "max_rate": 0.02, "confidence": 0.95},
    "bridge_bitexact": {"min_units": 12},
    "ledger_audit": {"min_units": 1},
    "donor_following": {"min_units": 10, "confidence": 0.95},
    "layer_sweep": {"min_units": 1},
}


@dataclass
class ClaimResult:
    name: str
    status: str
    n: int
    k: int
    interval: tuple[float, float]
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    counterexamples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval"] = [round(x, 6) for x in self.interval]
        return d


def thresholds(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, float]:
    if name not in DEFAULTS:
        raise KeyError(f"unknown claim {name!r}; known: {', '.join(DEFAULTS)}")
    th = dict(DEFAULTS[name])
    for k, v in (overrides or {}).items():
        if k not in th:
            raise KeyError(f"claim {name} has no threshold {k!r}; it has {', '.join(th)}")
        th[k] = float(v)
    return th


def _names(units: Iterable[str], limit: int = 8) -> str:
    u = list(units)
    return ", ".join(u[:limit]) + (f" and {len(u) - limit} more" if len(u) > limit else "")


def _combine(statuses: Iterable[str]) -> str:
    s = list(statuses)
    if FAIL in s:
        return FAIL
    if not s or INCONCLUSIVE in s:
        return INCONCLUSIVE
    return PASS


def _ineligible_note(records: list[CellRecord]) -> str:
    bad = [r for r in records if not r.eligible]
    if not bad:
        return ""
    reasons: dict[str, int] = {}
    for r in bad:
        key = r.error or r.reason or "?"
        reasons[key] = reasons.get(key, 0) + 1
    return " (ineligible: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) + ")"


def replica_exactness(records: list[CellRecord], th: Mapping[str, float]) -> ClaimResult:
    """Every replica (the same construction, precision and item computed twice) is bit-identical."""
    units, bad = 0, []
    for r in records:
        if not r.eligible:
            continue
        for c in ("live", "prefill"):
            units += 1
            a, b = r.constructions[c], r.constructions[f"{c}:replica"]
            if not a.same_as(b):
                what = "suffix" if a.suffix != b.suffix else "state" if a.state_fp != b.state_fp else "logits"
                bad.append(f"{r.item_id}@{r.dtype}/{c} ({what})")
    k = units - len(bad)
    iv = wilson_interval(k, units)
    if bad:
        return ClaimResult("replica_exactness", FAIL, units, k, iv, f"{len(bad)} replica(s) differ: {_names(bad)}",
                           {"mismatches": len(bad)}, bad)
    if units < th["min_units"]:
        return ClaimResult("replica_exactness", INCONCLUSIVE, units, k, iv,
                           f"{units} replica units, needs {int(th['min_units'])}{_ineligible_note(records)}")
    return ClaimResult("replica_exactness", PASS, units, k, iv, f"all {units} replicas bit-identical")


def matched_construction(records: list[CellRecord], th: Mapping[str, float], dtypes: tuple[str, ...]) -> ClaimResult:
    """Live vs one-shot prefill of identical ids: divergent suffixes and labels, accuracy difference CI."""
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
    return ClaimResult("matched_construction", _combine(statuses), n_all, k_all, primary_ci,
                       "; ".join(reasons) + _ineligible_note(records), figs, divergent_items)


def fixed_prefix_2x2(records: list[CellRecord], th: Mapping[str, float], dtypes: tuple[str, ...]) -> ClaimResult:
    """The primary precision's prefix ids held fixed, crossed with construction x precision."""
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
                reasons.append(f"{d}: fixed-prefix divergent set differs from the matched one on {_names(extra)}")
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
                reasons.append(f"{d}: {len(dis)}/{n} decoded disagreements ({rate:.1%} > {th['max_rate']:.0%}): {_names(dis)}")
            elif n >= th["min_units"] and hi <= th["max_rate"]:
                statuses.append(PASS)
                reasons.append(f"{d}: {len(dis)}/{n} disagreements, Wilson upper {hi:.2%} <= {th['max_rate']:.0%}")
            else:
                statuses.append(INCONCLUSIVE)
                reasons.append(f"{d}: {len(dis)}/{n} disagreements, Wilson upper {hi:.2%} above {th['max_rate']:.0%}: too few units")
    if not low or not high:
        statuses.append(INCONCLUSIVE)
        reasons.append("the 2x2 needs a low (bf16/fp16) and a high (fp32) precision in --kvaudit-dtypes")
    n_hi = sum(units[d] for d in high)
    k_hi = n_hi - sum(disagreements[d] for d in high)
    return ClaimResult("fixed_prefix_2x2", _combine(statuses), n_hi, k_hi, wilson_interval(k_hi, n_hi, th["confidence"]),
                       "; ".join(reasons), figs, bad)


def bridge_bitexact(records: list[CellRecord], th: Mapping[str, float]) -> ClaimResult:
    """Token-by-token incremental replay of the recorded ids equals the live cache, bit for bit."""
    rows = [r for r in records if r.eligible]
    unsupported = sorted({r.unsupported for r in rows if r.unsupported})
    if unsupported:
        return ClaimResult("bridge_bitexact", INCONCLUSIVE, 0, 0, (0.0, 1.0), unsupported[0])
    bad = []
    for r in rows:
        a, b = r.constructions["live"], r.constructions["incremental"]
        if r.bridge_mismatch or not a.same_as(b):
            where = f"K/V of layers {','.join(r.bridge_mismatch)}" if r.bridge_mismatch else (
                "suffix" if a.suffix != b.suffix else "logits")
            bad.append(f"{r.item_id}@{r.dtype} ({where})")
    n, k = len(rows), len(rows) - len(bad)
    iv = wilson_interval(k, n)
    if bad:
        return ClaimResult("bridge_bitexact", FAIL, n, k, iv, f"incremental differs from live on {_names(bad)}",
                           {"mismatches": len(bad)}, bad)
    if n < th["min_units"]:
        return ClaimResult("bridge_bitexact", INCONCLUSIVE, n, k, iv,
                           f"{n} units, needs {int(th['min_units'])}{_ineligible_note(records)}")
    return ClaimResult("bridge_bitexact", PASS, n, k, iv, f"incremental = live bit-exact on {k}/{n} (every layer's K and V, suffix)")


def donor_following(records: list[CellRecord], th: Mapping[str, float]) -> ClaimResult:
    """All-layer bidirectional transplant on divergent items: every receiver follows its donor."""
    rows = [r for r in records if r.eligible]
    unsupported = sorted({r.unsupported for r in rows if r.unsupported})
    figs: dict[str, Any] = {}
    bad, statuses, reasons = [], [], []
    n_all = k_all = 0
    # units chosen by divergence alone: the first max_units divergent records, in item order
    chosen = [r for r in rows if any(t.layers is None and t.parts == "kv" for t in r.transplants)]
    chosen = chosen[: int(th.get("max_units", len(chosen)))]
    for direction in ("live_to_prefill", "prefill_to_live"):
        ts = [(r, t) for r in chosen for t in r.transplants if t.direction == direction and t.layers is None and t.parts == "kv"]
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
    reason = ("receivers that did not follow: " + _names(bad) + "; " if bad else "") + ", ".join(reasons) + note
    return ClaimResult("donor_following", _combine(statuses), n_all, k_all, wilson_interval(k_all, n_all, th["confidence"]),
                       reason, figs, bad)


def layer_sweep(records: list[CellRecord], th: Mapping[str, float]) -> ClaimResult:
    """All layers together are sufficient on every swept unit; the sweep says which subsets also are."""
    from .analyses import layer_sweep as sweep

    sw = sweep(records, int(th.get("max_units", 1 << 30)))
    rows = {r["subset"]: r for r in sw["subsets"]}
    n = len(sw["units"])
    allkv = rows.get("all:kv")
    k = 0 if allkv is None else min(allkv["live_to_prefill"][0], allkv["prefill_to_live"][0])
    minimal = sw["minimal_sufficient"]
    figs = {"subsets": {r["subset"]: {"live_to_prefill": r["live_to_prefill"], "prefill_to_live": r["prefill_to_live"],
                                      "follow_rate": r["follow_rate"]} for r in sw["subsets"]},
            "minimal_sufficient": minimal["subset"] if minimal else None, "units": sw["units"]}
    iv = wilson_interval(k, n)
    if n < th["min_units"] or allkv is None:
        return ClaimResult("layer_sweep", INCONCLUSIVE, n, k, iv, f"{n} swept divergent units, needs {int(th['min_units'])}",
                           figs)
    if k < n:
        return ClaimResult("layer_sweep", FAIL, n, k, iv, f"all-layer transplant not followed on {n - k}/{n} swept units",
                           figs)
    partial = sorted((r for r in sw["subsets"] if r["subset"] != "all:kv"), key=lambda r: -r["follow_rate"])
    best = ", ".join(f"{r['subset']} {r['follow_rate']:.0%}" for r in partial[:3])
    return ClaimResult("layer_sweep", PASS, n, k, iv,
                       f"all layers sufficient on {k}/{n}; smallest sufficient subset {minimal['subset'] if minimal else '-'}; "
                       f"best partial: {best}", figs)


#: name -> judge; each takes (records, thresholds, dtypes)
JUDGES: dict[str, Callable[[list[CellRecord], Mapping[str, float], tuple[str, ...]], ClaimResult]] = {
    "replica_exactness": lambda r, t, d: replica_exactness(r, t),
    "matched_construction": matched_construction,
    "fixed_prefix_2x2": fixed_prefix_2x2,
    "bridge_bitexact": lambda r, t, d: bridge_bitexact(r, t),
    "donor_following": lambda r, t, d: donor_following(r, t),
    "layer_sweep": lambda r, t, d: layer_sweep(r, t),
}
