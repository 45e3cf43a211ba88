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


def matched_chances(n: int, discordance: float, delta: float, margin: float,
                    confidence: float = 0.95) -> tuple[float, float]:
    """(P(pass), P(fail)) of :func:`matched_rule` on ``n`` pairs when a share ``discordance`` of pairs disagree
    and the true accuracy difference is ``delta`` (|delta| <= discordance), by exact enumeration of the tables
    that carry all but a few :data:`TAIL` of the probability."""
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
    # b | m only where it carries probability: the cells grow as n sqrt(n), not n squared
    first = np.nan_to_num(stats.binom.ppf(TAIL, ms, share), nan=0.0).astype(int)
    last = np.nan_to_num(stats.binom.isf(TAIL, ms, share), nan=0.0).astype(int)
    first, last = np.clip(np.minimum(first, last), 0, ms), np.clip(np.maximum(first, last), 0, ms)
    count = last - first + 1
    m = np.repeat(ms, count)
    b = np.repeat(first, count) + np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
    w = np.repeat(pm, count) * stats.binom.pmf(b, m, share)
    passes, fails = matched_rule(b, m - b, n, margin, confidence)
    return float((w * passes).sum()), float((w * fails).sum())


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
