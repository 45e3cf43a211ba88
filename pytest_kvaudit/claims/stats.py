"""Intervals and tests for the claims, on scipy.stats wherever it has the method. Which interval decides what,
and at which level, is :mod:`pytest_kvaudit.claims.rules`; this module computes them.

- Clopper-Pearson (exact) bounds decide the rate claims; Wilson's interval is the paper's figure (1.88% at
  0/200), reported beside them.
- Tango's score interval for a paired difference of proportions decides matched_construction. Chosen over
  Newcombe's hybrid score because it depends on the discordant counts alone (so its size is enumerated
  exactly) and it keeps its width when nothing is discordant (±z²/(n+z²): ±1.88 points at 0/200 and z =
  1.96, the Wilson bound of the discordance itself); Newcombe's with continuity correction reaches a size
  of 5.9% (100 pairs, discordance at the margin) and the percentile bootstrap fails every k:0 table with
  k >= 4.
- The exact conditional McNemar p (a two-sided binomial test of the discordant pairs at one half) and the
  paired percentile bootstrap (the paper's method) are reported figures, never verdicts.

From the paper's own counts (200 pairs, 11 right only live, 9 only prefill) the paired percentile bootstrap
gives its CI of (-0.035, +0.055); Tango's interval on the same counts is (-0.036, +0.057), inside ±6 points,
and McNemar's p is 0.82.
"""

from __future__ import annotations

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


def z_two_sided(confidence: float) -> float:
    """The normal quantile of a two-sided interval at ``confidence`` (1.96 at 95%)."""
    _, stats = _scipy()
    return float(stats.norm.ppf(1 - (1 - confidence) / 2))


def _binomial_interval(k: int, n: int, confidence: float, method: str) -> tuple[float, float]:
    """scipy's interval for k of n by ``method``; (0, 1) when there is nothing to judge."""
    _check(k, n)
    if n == 0:
        return (0.0, 1.0)
    _, stats = _scipy()
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=confidence, method=method)
    return (float(ci.low), float(ci.high))


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion; (0, 1) when there is nothing to judge."""
    low, high = _binomial_interval(k, n, confidence, "wilson")
    return (max(0.0, low), min(1.0, high))


def clopper_pearson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for a proportion."""
    return _binomial_interval(k, n, confidence, "exact")


def paired_bootstrap_ci(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95, n_resamples: int = 10000, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap CI of mean(a) - mean(b) over paired units, resampling the pairs: the paper's
    method, reported beside the decision and never deciding (it has no width at zero discordance and fails
    chance k:0 tables).

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


def mcnemar_exact(a: Sequence[bool], b: Sequence[bool]) -> float:
    """Two-sided exact conditional McNemar p-value for paired 0/1 outcomes (:func:`mcnemar_counts`)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have equal length")
    return mcnemar_counts(sum(1 for x, y in zip(a, b) if x and not y), sum(1 for x, y in zip(a, b) if y and not x))


def mcnemar_counts(only_a: int, only_b: int) -> float:
    """Two-sided exact conditional McNemar p-value from the discordant counts: the binomial test of ``only_a``
    of ``only_a + only_b`` at one half (``scipy.stats.binomtest``); 1 with nothing discordant."""
    _check(only_a, only_a + only_b)
    if only_a + only_b == 0:
        return 1.0
    _, stats = _scipy()
    return float(stats.binomtest(only_a, only_a + only_b, 0.5).pvalue)


def mcnemar_p_array(b: Any, m: Any) -> Any:
    """:func:`mcnemar_counts` over arrays of ``b`` of ``m`` discordant pairs (the enumerations of the proofs and
    the power): at one half the binomial is symmetric, so the two-sided p is twice the smaller tail, at most 1."""
    np, stats = _scipy()
    b, m = np.asarray(b), np.asarray(m)
    p = np.minimum(1.0, 2 * np.minimum(stats.binom.cdf(b, m, 0.5), stats.binom.sf(b - 1, m, 0.5)))
    return np.where(m > 0, p, 1.0)


def tango_statistic(b: Any, c: Any, n: Any, delta: Any) -> Any:
    """Tango's score statistic for H0: p_a - p_b = delta, with the constrained maximum-likelihood estimate of
    the ``c`` cell's probability (Tango 1998, Statistics in Medicine 17:891); at delta = 0 it is McNemar's z."""
    np, _ = _scipy()
    w = -b - c + (2 * n - b + c) * delta
    q = (-w + np.sqrt(np.maximum(w * w + 8 * n * c * delta * (1 - delta), 0.0))) / (4 * n)
    var = n * (2 * q + delta * (1 - delta))
    return (b - c - n * delta) / np.sqrt(np.maximum(var, 1e-300))


def tango_array(b: Any, c: Any, n: Any, confidence: float = 0.95, z: float | None = None) -> tuple[Any, Any]:
    """Tango's score interval for a paired difference of proportions, ``(b - c) / n`` where ``b`` pairs are
    right only on the first side and ``c`` only on the second, over arrays: the deltas where the score
    statistic crosses ±z (``z`` given, or that of a two-sided ``confidence``), found by bisection (it falls as
    delta grows; 46 halvings reach 3e-14)."""
    np, _ = _scipy()
    b, c, n = (np.asarray(x, dtype=float) for x in (b, c, n))
    z = z_two_sided(confidence) if z is None else z
    ends = []
    for target in (z, -z):
        lo = np.full(np.broadcast(b, c, n).shape, -1.0 + 1e-12)
        hi = np.full_like(lo, 1.0 - 1e-12)
        for _ in range(46):
            mid = (lo + hi) / 2
            above = tango_statistic(b, c, n, mid) > target
            lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
        ends.append((lo + hi) / 2)
    return ends[0], ends[1]


def tango_interval(b: int, c: int, n: int, confidence: float = 0.95, z: float | None = None) -> tuple[float, float]:
    """:func:`tango_array` for one table; (-1, 1) with no pairs. 4:0 of 197 gives (+0.0008, +0.0510) at 95%."""
    _check(b + c, n)
    if n == 0:
        return (-1.0, 1.0)
    lo, hi = tango_array(b, c, n, confidence, z)
    return (max(-1.0, float(lo)), min(1.0, float(hi)))
