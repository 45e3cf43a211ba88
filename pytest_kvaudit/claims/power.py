"""What a decision rule will say before the data: its chance to pass or fail at given true rates, found by
exact enumeration, and the least n for a given chance. The plan's honest strict n
(:meth:`pytest_kvaudit.claims.base.Claim.strict_needs`) and the power each verdict reports come from here, and
the proofs of each rule's size (``tests/claims/test_decision_rules.py``) enumerate the same functions.

matched_construction's rule on a table of ``n`` pairs, ``b`` right only live and ``c`` only prefill
(:func:`matched_rule`): FAIL when the exact McNemar p is below alpha; else PASS when Tango's interval lies
within ±margin; else inconclusive. Its chances at a true discordance ``D`` and difference ``delta`` sum over
the discordant count ``m ~ Binomial(n, D)`` and ``b | m ~ Binomial(m, (1 + delta / D) / 2)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.stats import _scipy, mcnemar_p_array, rate_decision_array, tango_array
from pytest_kvaudit.core.cost.chance import least_n

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: the probability left out of an enumeration, per binomial tail
TAIL = 1e-12


def matched_rule(b: Any, c: Any, n: Any, margin: float, confidence: float = 0.95) -> tuple[Any, Any]:
    """(passes, fails) as boolean arrays over tables: fails when McNemar's exact p < 1 - confidence, passes when
    it does not and Tango's interval lies within [-margin, +margin]."""
    np, _ = _scipy()
    b, c = np.asarray(b), np.asarray(c)
    fails = mcnemar_p_array(b, b + c) < 1 - confidence
    lo, hi = tango_array(b, c, n, confidence)
    return (~fails) & (lo >= -margin - 1e-12) & (hi <= margin + 1e-12), fails


def pass_band(ms: Any, n: int, margin: float, confidence: float = 0.95) -> Any:
    """For each discordant count ``m`` of ``n`` pairs, the largest ``b`` at or above m/2 that
    :func:`matched_rule` passes (m/2 - 1 where none does). The rule is symmetric in b and c and passes a band
    around b = c, so it passes exactly ``m - band <= b <= band`` (``tests/claims/test_decision_rules.py`` checks
    this against every table up to 200 pairs); a bisection over b finds the band in a few evaluations a count."""
    np, _ = _scipy()
    ms = np.asarray(ms)
    mid = (ms + 1) // 2  # the least b at or above m/2
    lo, hi = mid - 1, ms + 1  # lo passes (or is the sentinel below mid), hi fails (or is past m)
    first = matched_rule(mid, ms - mid, n, margin, confidence)[0]
    lo = np.where(first, mid, lo)
    hi = np.where(first, hi, mid)
    while np.any(hi - lo > 1):
        probe = (lo + hi) // 2
        ok = matched_rule(probe, ms - probe, n, margin, confidence)[0]
        live = hi - lo > 1
        lo, hi = np.where(live & ok, probe, lo), np.where(live & ~ok, probe, hi)
    return lo


def fail_edge(ms: Any, alpha: float) -> Any:
    """For each discordant count ``m``, the least ``b`` at or above m/2 where McNemar's exact p is below
    ``alpha`` (m + 1 where none is): its p falls as b moves away from m/2, so a bisection finds it."""
    np, _ = _scipy()
    ms = np.asarray(ms)
    lo, hi = (ms + 1) // 2 - 1, ms + 1  # lo is not rejected (or a sentinel), hi is rejected (or past m)
    while np.any(hi - lo > 1):
        probe = (lo + hi) // 2
        bad = mcnemar_p_array(probe, ms) < alpha
        live = hi - lo > 1
        lo, hi = np.where(live & ~bad, probe, lo), np.where(live & bad, probe, hi)
    return hi


def matched_chances(n: int, discordance: float, delta: float, margin: float,
                    confidence: float = 0.95) -> tuple[float, float]:
    """(P(pass), P(fail)) of :func:`matched_rule` on ``n`` pairs when a share ``discordance`` of pairs disagree
    and the true accuracy difference is ``delta`` (|delta| <= discordance), exactly: over every discordant count
    that carries more than :data:`TAIL` of the probability, the binomial mass of b inside the pass band
    (:func:`pass_band`) and in McNemar's two tails."""
    np, stats = _scipy()
    if abs(delta) > discordance + 1e-12:
        raise ValueError(f"an accuracy difference of {delta} needs at least that share of discordant pairs, "
                         f"got {discordance}")
    if discordance <= 0:
        passes, fails = matched_rule(0, 0, n, margin, confidence)
        return float(passes), float(fails)
    ms = np.arange(n + 1)
    pm = stats.binom.pmf(ms, n, discordance)
    ms, pm = ms[pm > TAIL], pm[pm > TAIL]
    share = min(1.0, max(0.0, (1 + delta / discordance) / 2))
    band = pass_band(ms, n, margin, confidence)
    inside = np.where(band >= ms - band,
                      stats.binom.cdf(band, ms, share) - stats.binom.cdf(ms - band - 1, ms, share), 0.0)
    # McNemar rejects the tails: b >= r or b <= m - r, with r its least rejected b at or above m/2
    r = fail_edge(ms, 1 - confidence)
    fails = np.where(r <= ms, stats.binom.sf(r - 1, ms, share) + stats.binom.cdf(ms - r, ms, share), 0.0)
    return float((pm * inside).sum()), float((pm * fails).sum())


def rate_pass_chance(n: int, rate: float, threshold: float, confidence: float = 0.95) -> float:
    """P(the Wilson upper bound of Binomial(n, rate) / n is at or below ``threshold``): a rate claim's chance
    to pass."""
    np, stats = _scipy()
    ks = np.arange(n + 1)
    return float((stats.binom.pmf(ks, n, rate) * rate_decision_array(ks, n, threshold, confidence)[0]).sum())


def rate_chances(n: int, rate: float, threshold: float, confidence: float = 0.95) -> tuple[float, float]:
    """(P(pass), P(fail)) of the rate rule on ``n`` units at a true ``rate``, exactly."""
    np, stats = _scipy()
    ks = np.arange(n + 1)
    pm = stats.binom.pmf(ks, n, rate)
    passes, fails = rate_decision_array(ks, n, threshold, confidence)
    return float((pm * passes).sum()), float((pm * fails).sum())


def items_for(units: int | None, rates: Mapping[str, float]) -> int | None:
    """The items that give ``units`` units at the calibrated eligibility rate (eligible units per item); None where
    no number of items does."""
    eligible = rates.get("eligible_items_per_precision", 1.0)
    return None if units is None or eligible <= 0 else math.ceil(units / eligible - 1e-9)


def units_for_equivalence(discordance: float, margin: float, confidence: float = 0.95,
                          target: float = 0.8) -> int | None:
    """The least pairs for a ``target`` chance that matched_construction passes when accuracy does not move
    and a share ``discordance`` of pairs disagree (half each way); 61 at no discordance and ±6 points, where
    Tango's interval is ±z²/(n+z²)."""
    return least_n(lambda n: matched_chances(n, discordance, 0.0, margin, confidence)[0], target, start=2)


def units_for_rate(rate: float, threshold: float, confidence: float = 0.95, target: float = 0.8) -> int | None:
    """The least units for a ``target`` chance that a rate claim passes at a true ``rate`` (189 at 0 and 2%);
    None when the rate is at or above the threshold (no n passes it more often than alpha)."""
    if rate >= threshold:
        return None
    return least_n(lambda n: rate_pass_chance(n, rate, threshold, confidence), target)
