"""What a run will have of each kind of evidence, set against what its claims need: whether each claim can
decide (``decides``), and what n a strict gate needs of it (``strict_n``, :func:`strict_plan`). The plan's
verdict columns (:mod:`pytest_kvaudit.core.planning.plan`); no pytest, no torch.

The strict n is the n for an 80% chance that the claim passes under ``--kvaudit-strict`` at the calibrated
rates (a count of divergent units is binomial, a claim's interval its own chance: ``Claim.strict_needs``), and
the range of that n over the rates' 95% Wilson intervals: a calibration of 8 items that saw no divergence
cannot say the rate is 0, so the plan says "unknown, at least N" (N at the top of the interval) instead of
"fails".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.cost.chance import TARGET, items_for_count, wilson
from pytest_kvaudit.core.model.config import LOW_PRECISION

if TYPE_CHECKING:
    from pytest_kvaudit.core.cost.pricing import Lengths
    from pytest_kvaudit.core.model.config import AuditConfig

NOT_APPLICABLE = "not applicable"
#: a claim's further needs at the expected per-item rates (``Claim.strict_needs`` with its thresholds bound)
StrictFn = Callable[[Mapping[str, float]], Mapping[str, "int | None"]]


def decides(needs: Mapping[str, float | None], have: Mapping[str, tuple[float | None, float | None]],
            inapplicable: str | None = None) -> dict[str, Any]:
    """Set what a claim needs against what the run will have: at most (the bound) and as expected; a claim
    that cannot run here (``inapplicable`` says why) decides nothing, whatever the evidence."""
    rows, verdicts = {}, []
    for what, need in needs.items():
        most, exp = have.get(what, (None, None))
        if need is None:
            v = "never"  # no amount of evidence clears the threshold
        elif most is None:
            v = "depends on the run"
        elif most < need:
            v = "no"
        elif exp is not None and exp >= need:
            v = "yes"
        else:
            v = "depends on the run"
        rows[what] = {"needs": need, "at_most": most, "expected": exp, "decides": v}
        verdicts.append(v)
    order = ("never", "no", "depends on the run", "yes")
    overall = min(verdicts, key=order.index) if verdicts else "yes"
    if inapplicable is not None:
        return {"decides": NOT_APPLICABLE, "why": inapplicable, "needs": rows}
    return {"decides": overall, "needs": rows}


def strict_n(needs: Mapping[str, float | None], rates: Mapping[str, float],
             extra: Mapping[str, int | None] = {}, caps: Mapping[str, float] = {}) -> dict[str, Any]:
    """The least ``--kvaudit-n`` at which a claim can decide (what ``--kvaudit-strict`` needs of it): for each
    count it needs (:meth:`Claim.least_evidence`), the items for an 80% chance of that count at the expected
    ``rates`` (eligible units per item, divergent units per item...: :func:`items_for_count`), and the claim's
    own further needs (``extra``: the items for an 80% chance that its interval clears its threshold). None
    where no n gets there at these rates or above a cap whatever n (``caps``: the donor units); a need that is
    a share (``label_rate``) does not grow with n and is left to ``decides``."""
    by: dict[str, int | None] = {}
    for what, need in needs.items():
        if what not in rates:
            continue
        if need is None or rates[what] <= 0 or need > caps.get(what, math.inf):
            by[what] = None
        else:
            items = items_for_count(rates[what], need)
            by[what] = None if items is None else max(1, items)
    by.update(extra)
    n = None if any(v is None for v in by.values()) else max((v for v in by.values() if v is not None), default=0)
    return {"n": n, "by": by}


def rates(cfg: AuditConfig, sample: Mapping[str, Sequence[Lengths]], end: str | None = None) -> dict[str, float]:
    """What one item of the set yields of each kind of evidence: the sample's rates where there is a sample
    (else the bound's, every item eligible and divergent), without the donor cap (:func:`strict_n` applies it);
    ``divergent_rate_max`` is the highest divergent-suffix rate of a precision, ``divergent_rate_high`` that of
    the high precisions (fp32). ``end`` ("low" or "high") takes every rate at that end of its 95% Wilson
    interval instead of the sample's share."""
    have = evidence(cfg.replace(donor_max_units=10**9), 1, sample, end)
    out = {w: float(exp if exp is not None else most) for w, (most, exp) in have.items() if most is not None}
    div = {d: _share(rows, "divergent", end) for d, rows in sample.items() if rows}
    out["divergent_rate_max"] = max(div.values()) if div else 1.0
    high = [v for d, v in div.items() if d not in LOW_PRECISION]
    out["divergent_rate_high"] = max(high) if high else (0.0 if sample else 1.0)
    return out


def _share(rows: Sequence[Lengths], attr: str, end: str | None) -> float:
    """The sample's share of ``attr``, or an end of its Wilson interval."""
    k = sum(bool(getattr(x, attr)) for x in rows)
    if end is None:
        return k / len(rows)
    lo, hi = wilson(k, len(rows))
    return lo if end == "low" else hi


def strict_plan(needs: Mapping[str, float | None], sample: Mapping[str, Sequence[Lengths]], cfg: AuditConfig,
                further: StrictFn | None = None) -> dict[str, Any]:
    """:func:`strict_n` at the calibrated rates, with its range over the rates' intervals (``range``: [least,
    most], None for "no n"), and ``at_least`` where the calibration saw nothing to estimate: no n at the
    sample's rates, some n at the top of their intervals ("unknown, at least N", never "fails")."""
    cap = caps(cfg)

    def at(r: Mapping[str, float]) -> dict[str, Any]:
        return strict_n(needs, r, further(r) if further else {}, cap)

    out = at(rates(cfg, sample))
    ends = [at(rates(cfg, sample, e)) for e in ("low", "high")] if any(sample.values()) else [out, out]
    # each need at its own most and least favourable end (the rates pull some needs one way, others the other)
    every = [[x["by"].get(w) for x in (out, *ends)] for w in out["by"]]
    best = [min((v for v in vs if v is not None), default=None) for vs in every]
    worst = [None if None in vs else max(v for v in vs if v is not None) for vs in every]
    least = None if None in best else max((v for v in best if v is not None), default=0)
    most = None if None in worst else max((v for v in worst if v is not None), default=0)
    out["range"] = [least, most]
    out["chance"] = TARGET
    out["at_least"] = least if out["n"] is None else None
    return out


def evidence(cfg: AuditConfig, items: int, sample: Mapping[str, Sequence[Lengths]],
             end: str | None = None) -> dict[str, tuple[float | None, float | None]]:
    """What the run will have of each kind of evidence the claims name: (at most, expected); ``end`` as in
    :func:`rates`."""
    d = len(cfg.dtypes)
    low = [x for x in cfg.dtypes if x in LOW_PRECISION]
    high = [x for x in cfg.dtypes if x not in LOW_PRECISION]

    def rate(dtype: str, attr: str) -> float | None:
        rows = sample.get(dtype, ())
        return _share(rows, attr, end) if rows else None

    elig = [rate(x, "eligible") for x in cfg.dtypes]
    e_min = None if any(e is None for e in elig) else min(e for e in elig if e is not None) * items
    e_sum = None if any(e is None for e in elig) else sum(e for e in elig if e is not None) * items
    div_low = [rate(x, "divergent") for x in low]
    e_div_low = None if not low or any(v is None for v in div_low) else min(v for v in div_low if v is not None) * items
    # the replicas and the bridge run on the first exact_items items only (None: every item)
    ex = items if cfg.exact_items is None else min(items, cfg.exact_items)
    e_ex = None if e_sum is None else e_sum * ex / max(1, items)
    div_all = [rate(x, "divergent") for x in cfg.dtypes]
    e_div = None if any(v is None for v in div_all) else sum(v for v in div_all if v is not None) * items
    sides = {w: [_side_share(sample.get(x, ()), w, end) for x in cfg.dtypes] for w in ("right", "wrong")}
    e_side = {w: None if any(v is None for v in vs) else min(v for v in vs if v is not None) * items
              for w, vs in sides.items()}
    return {
        "units": (items * d, e_sum),
        "replica_pairs": (2 * ex * d, None if e_ex is None else 2 * e_ex),
        "eligible_items_per_precision": (items, e_min),
        "items_x_precisions": (ex * d, e_ex),
        "units_per_high_precision": (items if high else 0, e_min if high else 0),
        "divergent_units_per_low_precision": (items if low else 0, e_div_low if low else 0),
        "divergent_units_per_direction": (min(items * d, cfg.donor_max_units),
                                          None if e_div is None else min(e_div, cfg.donor_max_units)),
        # labels that can move: items right (wrong) on the side with fewer, at the precision with fewest
        "right_items_per_side": (items, e_side["right"]),
        "wrong_items_per_side": (items, e_side["wrong"]),
    }


def _side_share(rows: Sequence[Lengths], which: str, end: str | None) -> float | None:
    """The share of items right (``which="right"``) on the side (live or prefill) with fewer right answers, or
    wrong on the side with fewer wrong: what ``matched_construction``'s ``min_each`` counts, per item of the
    set; None where no row knows its labels (an engine's calibration that does not extract them)."""
    known = [x.right for x in rows if x.right is not None]
    if not known:
        return None
    live, pre = sum(a for a, _ in known), sum(b for _, b in known)
    k = min(live, pre) if which == "right" else len(known) - max(live, pre)
    if end is None:
        return k / len(rows)
    lo, hi = wilson(k, len(rows))
    return lo if end == "low" else hi


def caps(cfg: AuditConfig) -> dict[str, float]:
    """The most of each kind of evidence any n can give (:func:`strict_n`): the donor units cap the transplants,
    ``--kvaudit-exact-items`` the replicas and the bridge."""
    out: dict[str, float] = {"divergent_units_per_direction": cfg.donor_max_units}
    if cfg.exact_items is not None:
        d = len(cfg.dtypes)
        out.update(replica_pairs=2 * cfg.exact_items * d, items_x_precisions=cfg.exact_items * d)
    return out
