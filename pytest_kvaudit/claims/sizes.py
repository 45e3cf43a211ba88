"""Each decision rule's size, by exact enumeration at every n: the proof that ``benchmarks/decision_rules.py``
prints (every n up to 1,000) and ``tests/claims/test_decision_rules.py`` checks (every n up to 400, and the worst
n found beyond it).

The rule's verdict on every table comes from the rule functions themselves (:mod:`pytest_kvaudit.claims.rules`,
through :func:`pytest_kvaudit.claims.power.matched_edges_many` and :func:`pytest_kvaudit.claims.power.rate_edges`);
the binomial masses come from tables built by the recursion pmf(m + 1, k) = (1 - p) pmf(m, k) + p pmf(m, k - 1),
one table per discordance, so that a thousand n cost a few seconds instead of millions of calls to
``scipy.stats.binom.cdf``. Sizes are at the null's edge, where they are largest: for matched_construction a true
difference of exactly the margin (the rule is symmetric in the two sides, so +margin stands for both), at each
discordance on a 0.01 grid from the margin (every discordant pair one way: the worst case of Tango's form) to 1;
for a rate rule a true rate of exactly the threshold (and the 0.01 grid around it, where chances are smaller).
"""

from __future__ import annotations

import math
from typing import Any

from pytest_kvaudit.claims.power import matched_edges_many, rate_edges
from pytest_kvaudit.claims.stats import _scipy

#: the grid of true discordances and rates
STEP = 0.01


def binomial_table(top: int, p: float) -> Any:
    """pmf[m, k] = P(Binomial(m, p) = k) for m, k = 0..top, by the recursion over m (exact up to rounding)."""
    np, _ = _scipy()
    pmf = np.zeros((top + 1, top + 1))
    pmf[0, 0] = 1.0
    for m in range(top):
        pmf[m + 1] = (1 - p) * pmf[m]
        pmf[m + 1, 1:] += p * pmf[m, :-1]
    return pmf


def discordances(margin: float) -> Any:
    """The discordances a difference of ``margin`` allows: the margin itself, then the 0.01 grid up to 1."""
    np, _ = _scipy()
    grid = np.round(np.arange(math.ceil(margin / STEP - 1e-9), round(1 / STEP) + 1) * STEP, 10)
    return np.unique(np.concatenate([[margin], grid[grid >= margin]]))


def matched_sizes(ns: Any, margin: float, confidence: float = 0.95, verdicts: tuple[int, ...] = (1, 2, 3, 4),
                  ds: Any = None) -> dict[str, Any]:
    """matched_construction's sizes at a true difference of ``margin``: ``{"pass": [d, n], f"fail/{v}": [d, n]}``
    arrays (discordance x n) of P(PASS) and of P(FAIL) with alpha split over ``v`` verdicts."""
    np, _ = _scipy()
    ns = np.asarray(ns, dtype=int)
    ds = discordances(margin) if ds is None else np.asarray(ds, dtype=float)
    n_of, ms, band, _ = matched_edges_many(ns, margin, confidence, 1, which="pass")
    edges = {v: matched_edges_many(ns, margin, confidence, v, which="fail")[3] for v in verdicts}
    at = np.searchsorted(np.cumsum(ns + 1), np.arange(ms.size), side="right")  # which n each entry belongs to
    top = int(ns.max())
    out = {"pass": np.zeros((ds.size, ns.size)), **{f"fail/{v}": np.zeros((ds.size, ns.size)) for v in verdicts}}
    lo_pass = ms - band - 1  # pass: m - band <= b <= band
    for i, d in enumerate(ds):
        pm = binomial_table(top, d)[n_of, ms]  # P(m discordant of n)
        cond = binomial_table(top, min(1.0, (1 + margin / d) / 2))
        cdf = np.cumsum(cond, axis=1)
        sf = np.cumsum(cond[:, ::-1], axis=1)[:, ::-1]  # sf[m, k] = P(b >= k)

        def below(k: Any, cdf: Any = cdf) -> Any:
            return np.where(k >= 0, cdf[ms, np.clip(k, 0, top)], 0.0)

        def above(k: Any, sf: Any = sf) -> Any:
            return np.where(k <= ms, sf[ms, np.clip(k, 0, top)], 0.0)

        inside = np.where(band >= ms - band, below(band) - below(lo_pass), 0.0)
        out["pass"][i] = np.bincount(at, pm * inside, minlength=ns.size)
        for v, edge in edges.items():
            out[f"fail/{v}"][i] = np.bincount(at, pm * (above(edge) + below(ms - edge)), minlength=ns.size)
    return out


def rate_sizes(ns: Any, threshold: float, confidence: float = 0.95,
               verdicts: tuple[int, ...] = (1, 2, 3, 4)) -> dict[str, Any]:
    """A rate rule's sizes at every n of ``ns``: ``{"pass": [n], f"fail/{v}": [n]}``, P(PASS) at a true rate of
    ``threshold`` and above on the 0.01 grid (the largest) and P(FAIL) at the threshold and below."""
    np, stats = _scipy()
    ns = np.asarray(ns, dtype=int)
    grid = np.round(np.arange(0, round(1 / STEP) + 1) * STEP, 10)
    up = np.unique(np.concatenate([[threshold], grid[grid >= threshold]]))[:, None]
    down = np.unique(np.concatenate([[threshold], grid[grid <= threshold]]))[:, None]
    top, _ = rate_edges(ns, threshold, confidence)  # passes k <= top
    out = {"pass": np.where(top >= 0, stats.binom.cdf(top, ns, up), 0.0).max(axis=0)}
    for v in verdicts:
        _, low = rate_edges(ns, threshold, confidence, v)  # fails k >= low
        out[f"fail/{v}"] = np.where(low <= ns, stats.binom.sf(low - 1, ns, down), 0.0).max(axis=0)
    return out


def wilson_pass_sizes(ns: Any, threshold: float, confidence: float = 0.95) -> Any:
    """P(PASS) at a true rate of ``threshold`` had the rate rule passed on Wilson's upper bound (the paper's
    figure, and the rule before issue 45): the reason it reports and never decides."""
    np, stats = _scipy()
    z = stats.norm.isf((1 - confidence) / 2)
    out = []
    for n in np.asarray(ns, dtype=int):
        k = np.arange(n + 1)
        p = k / n
        upper = (p + z * z / (2 * n) + z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n)
        out.append(float(stats.binom.pmf(k, n, threshold)[upper <= threshold].sum()))
    return np.asarray(out)
