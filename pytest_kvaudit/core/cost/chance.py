"""Chances of counts, for the plan's honest strict n: the least items for an 80% chance of a count, and a
calibration rate's Wilson interval, the range the plan gives its n over. scipy is imported on first use; the
decision rules' own chances (:mod:`pytest_kvaudit.claims.power`) build on these."""

from __future__ import annotations

import math
from collections.abc import Callable

#: the chance to pass that the plan's strict n is for
TARGET = 0.8
#: z of a two-sided 95% interval
Z95 = 1.959963984540054


def least_n(chance: Callable[[int], float], target: float = TARGET, start: int = 1, limit: int = 20000) -> int | None:
    """The least n at which ``chance(n) >= target``, by doubling and bisection (the chances here rise with n,
    up to the ripples of a discrete count); None when no n up to ``limit`` gets there."""
    lo, hi = start - 1, max(start, 1)
    while chance(hi) < target:
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if chance(mid) >= target else (mid, hi)
    return hi


def count_chance(n: int, rate: float, k: int) -> float:
    """P(Binomial(n, rate) >= k): the chance that ``n`` items give ``k`` units of a kind seen at ``rate``."""
    from scipy import stats

    return 1.0 if k <= 0 else float(stats.binom.sf(k - 1, n, min(1.0, rate)))


def items_for_count(rate: float, k: float, target: float = TARGET) -> int | None:
    """The least items for a ``target`` chance of at least ``k`` units when an item yields ``rate`` of them: a
    binomial count for a rate up to 1, a rate above 1 (units of several precisions per item) taken as exact;
    None at a rate of 0."""
    need = math.ceil(k - 1e-9)
    if need <= 0:
        return 0
    if rate <= 0:
        return None
    if rate >= 1:
        return max(1, math.ceil(need / rate - 1e-9))
    return least_n(lambda n: count_chance(n, rate, need), target, start=need)


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson interval of k/n (closed form, the same as scipy's; the core keeps no claim imports)."""
    if n <= 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))
