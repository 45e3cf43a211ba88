"""Intervals and tests for the claims, on scipy.stats wherever it has the method.

From the paper's own counts these reproduce its figures: 0 of 200 gives a Wilson 95% upper bound of
0.01885, and 200 paired labels with 11 right only on one side and 9 only on the other give a paired
percentile-bootstrap 95% CI of (-0.035, +0.055) for the accuracy difference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any


def _scipy() -> tuple[Any, Any]:
    """numpy and scipy.stats, imported on first use: the claims load with the plugin, and ``pytest --help`` or
    a run that judges nothing should not pay for scipy."""
    import numpy
    from scipy import stats

    return numpy, stats


def _check(k: int, n: int) -> None:
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when there is nothing to judge."""
    _check(k, n)
    if n == 0:
        return (0.0, 1.0)
    _, stats = _scipy()
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="wilson")
    return (max(0.0, float(ci.low)), min(1.0, float(ci.high)))


def least_units_for_upper(max_rate: float, k: int = 0, confidence: float = 0.95, limit: int = 10**8) -> int | None:
    """The least n at which k failures of n have a Wilson upper bound at or below ``max_rate`` (the upper
    bound falls as n grows with k fixed); None when no n up to ``limit`` gets there. At k=0 and 95% it is
    ceil(z^2 (1 - r) / r): 189 units for 2%."""
    if max_rate <= 0:
        return None
    n = max(k, 1)
    if wilson_interval(k, n, confidence)[1] <= max_rate:
        return n
    hi = n
    while wilson_interval(k, hi, confidence)[1] > max_rate:
        n, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - n > 1:  # upper(n) > max_rate >= upper(hi)
        mid = (n + hi) // 2
        n, hi = (mid, hi) if wilson_interval(k, mid, confidence)[1] > max_rate else (n, mid)
    return hi


def paired_units_for_margin(margin: float, discordance: float, confidence: float = 0.95) -> int | None:
    """The least n of paired 0/1 outcomes at which the accuracy difference's CI lies within ``±margin``, when a
    share ``discordance`` of pairs disagree (half each way, the difference 0): the normal approximation to the
    paired bootstrap's half-width, z sqrt(discordance / n), which the bootstrap tracks at these n. 1 when no pair
    disagrees (the interval is a point); None for a margin of 0 that some disagreement can never meet."""
    if discordance <= 0:
        return 1
    if margin <= 0:
        return None
    _, stats = _scipy()
    z = float(stats.norm.ppf(1 - (1 - confidence) / 2))
    return max(1, math.ceil(z * z * discordance / (margin * margin) - 1e-9))


def clopper_pearson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a proportion."""
    _check(k, n)
    if n == 0:
        return (0.0, 1.0)
    _, stats = _scipy()
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method="exact")
    return (float(ci.low), float(ci.high))


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact McNemar p-value for paired 0/1 outcomes (a binomial test on the discordant pairs)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have equal length")
    only_a = sum(1 for x, y in zip(a, b) if x and not y)
    only_b = sum(1 for x, y in zip(a, b) if y and not x)
    if only_a + only_b == 0:
        return 1.0
    _, stats = _scipy()
    return float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(a) - mean(b) over paired units, resampling the pairs.

    scipy.stats.bootstrap draws the resamples (``paired=True``); degenerate samples (every pair has the
    same difference) have a zero-width interval at that difference.
    """
    np, stats = _scipy()
    x = np.asarray(a, dtype=float)
    y = np.asarray(b, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("paired samples must be 1-D and of equal length")
    if x.size == 0:
        return (float("-inf"), float("inf"))
    d = x - y
    if np.all(d == d[0]):
        return (float(d[0]), float(d[0]))
    res = stats.bootstrap(
        (x, y),
        lambda u, v, axis=-1: np.mean(u, axis=axis) - np.mean(v, axis=axis),
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return (float(res.confidence_interval.low), float(res.confidence_interval.high))
