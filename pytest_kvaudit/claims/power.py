"""What a decision rule will say before the data: its chances to pass and to fail at given true rates, found by
exact enumeration of the rule functions themselves (:mod:`pytest_kvaudit.claims.rules`, never a copy), and the
least n at which a verdict's chance holds. The plan's strict n (:meth:`pytest_kvaudit.claims.base.Claim.strict_needs`,
:func:`verdict_chance`), the chances each verdict reports and the proofs of each rule's size
(``tests/claims/test_decision_rules.py``, ``benchmarks/decision_rules.py``) all read these.

matched_construction's chances at a true discordance ``D`` (the share of pairs whose labels differ) and difference
``delta`` sum over the discordant count ``m ~ Binomial(n, D)`` and ``b | m ~ Binomial(m, (1 + delta / D) / 2)``:
the rule passes a band of b around m/2 and fails its two tails (:func:`matched_edges`), so each chance is a sum of
binomial tails. Power is always at a named discordance: the plan's (calibrated on a few items: the divergent-suffix
rate, an upper bound on the label discordance) or the observed one, labelled so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.claims.rules import PROVEN_UP_TO, matched_rule, rate_rule
from pytest_kvaudit.claims.stats import _scipy

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim

#: the probability left out of an enumeration, per binomial tail
TAIL = 1e-13
#: the chance of a verdict that the plan's strict n is for
TARGET = 0.8


def _bisect(ms: Any, lo: Any, hi: Any, ok: Callable[[Any], Any]) -> tuple[Any, Any]:
    """Per discordant count, the edge between ``lo`` (``ok``, or a sentinel) and ``hi`` (not ``ok``, or a
    sentinel): the rule is monotone in b on either side of m/2, so a bisection finds it in log2(n) calls."""
    np, _ = _scipy()
    while np.any(hi - lo > 1):
        probe = (lo + hi) // 2
        good = ok(probe)
        live = hi - lo > 1
        lo, hi = np.where(live & good, probe, lo), np.where(live & ~good, probe, hi)
    return lo, hi


def matched_edges_many(ns: Any, margin: float, confidence: float = 0.95, verdicts: int = 1,
                       m_from: Any = None, m_to: Any = None, which: str = "pass,fail") -> tuple[Any, ...]:
    """:func:`matched_edges` for every n in ``ns`` at once, flattened: (n, m, band, edge) over each n's
    discordant counts m = ``m_from..m_to`` (default 0..n), so one bisection serves a whole scan over n; only the
    edges ``which`` names are computed (None for the other)."""
    np, _ = _scipy()
    ns = np.asarray(ns, dtype=int)
    first = np.zeros_like(ns) if m_from is None else np.asarray(m_from, dtype=int)
    count = (ns if m_to is None else np.asarray(m_to, dtype=int)) - first + 1
    n_of = np.repeat(ns, count)
    ms = np.arange(n_of.size) - np.repeat(np.cumsum(count) - count, count) + np.repeat(first, count)
    mid = (ms + 1) // 2
    band = edge = None
    if "pass" in which:
        band, _ = _bisect(ms, mid - 1, ms + 1, lambda b: matched_rule(b, ms - b, n_of, margin, confidence, verdicts)[0])
    if "fail" in which:
        _, edge = _bisect(ms, mid - 1, ms + 1,
                          lambda b: ~matched_rule(b, ms - b, n_of, margin, confidence, verdicts)[1])
    return n_of, ms, band, edge


@lru_cache(maxsize=4096)
def matched_edges(n: int, margin: float, confidence: float = 0.95, verdicts: int = 1) -> tuple[Any, Any]:
    """For each discordant count ``m = 0..n`` of ``n`` pairs: the largest ``b`` that :func:`matched_rule`
    passes (it passes exactly ``m - band <= b <= band``; below m/2 where none does), and the least ``b`` above
    m/2 that it fails (it fails ``b >= edge`` and ``b <= m - edge``; m + 1 where none). The rule is symmetric in
    b and c; ``tests/claims/test_decision_rules.py`` checks both edges against every table up to 200 pairs.
    Cached: the enumerations ask for the same n many times."""
    _, _, band, edge = matched_edges_many([n], margin, confidence, verdicts)
    band.flags.writeable = edge.flags.writeable = False  # cached: shared by every caller at this n
    return band, edge


def _given(ms: Any, band: Any, edge: Any, share: Any) -> tuple[Any, Any]:
    """P(pass | m) and P(fail | m) with b ~ Binomial(m, share): the band's mass and the two tails' mass."""
    np, stats = _scipy()
    inside = np.where(band >= ms - band,
                      stats.binom.cdf(band, ms, share) - stats.binom.cdf(ms - band - 1, ms, share), 0.0)
    tails = np.where(edge <= ms, stats.binom.sf(edge - 1, ms, share) + stats.binom.cdf(ms - edge, ms, share), 0.0)
    return inside, tails


def _share(discordance: Any, delta: Any) -> Any:
    """The share of discordant pairs right only on the first side, for a difference ``delta``."""
    np, _ = _scipy()
    d, dl = np.broadcast_arrays(np.asarray(discordance, dtype=float), np.asarray(delta, dtype=float))
    if np.any(np.abs(dl) > d + 1e-12):
        raise ValueError(f"an accuracy difference needs at least that share of discordant pairs: {delta} > "
                         f"{discordance}")
    return np.clip((1 + np.divide(dl, d, out=np.zeros_like(d), where=d > 0)) / 2, 0.0, 1.0)


def matched_curve(ns: Any, discordance: float, delta: float, margin: float, confidence: float = 0.95,
                  verdicts: int = 1) -> tuple[Any, Any]:
    """(P(pass), P(fail)) of :func:`matched_rule` at every n in ``ns`` (arrays), at one discordance and
    difference: the scan over n that :func:`least_n_holding` reads, in one pass."""
    np, stats = _scipy()
    ns = np.asarray(ns, dtype=int)
    # only the discordant counts that carry more than TAIL of the probability, per n
    lo = np.maximum(stats.binom.ppf(TAIL, ns, discordance) - 1, 0).astype(int)
    hi = np.minimum(stats.binom.isf(TAIL, ns, discordance) + 1, ns).astype(int)
    n_of, ms, band, edge = matched_edges_many(ns, margin, confidence, verdicts, lo, hi)
    inside, tails = _given(ms, band, edge, _share(discordance, delta))
    pm = stats.binom.pmf(ms, n_of, discordance)
    starts = np.cumsum(hi - lo + 1) - (hi - lo + 1)
    return np.add.reduceat(pm * inside, starts), np.add.reduceat(pm * tails, starts)


def matched_chances(n: int, discordance: Any, delta: Any, margin: float, confidence: float = 0.95,
                    verdicts: int = 1, edges: tuple[Any, Any] | None = None) -> tuple[Any, Any]:
    """(P(pass), P(fail)) of :func:`matched_rule` on ``n`` pairs when a share ``discordance`` of pairs disagree
    and the true accuracy difference is ``delta`` (|delta| <= discordance), exactly up to :data:`TAIL`. Floats
    for scalars; arrays over arrays of discordances and differences (``edges`` from :func:`matched_edges`, to
    reuse them across calls at one n)."""
    np, stats = _scipy()
    scalar = np.ndim(discordance) == 0 and np.ndim(delta) == 0
    share = _share(np.atleast_1d(discordance), np.atleast_1d(delta))
    d = np.broadcast_to(np.atleast_1d(np.asarray(discordance, dtype=float)), share.shape)
    band, edge = edges if edges is not None else matched_edges(n, margin, confidence, verdicts)
    ms = np.arange(n + 1)
    pm = stats.binom.pmf(ms[None, :], n, d[:, None])
    keep = np.nonzero(pm.max(axis=0) > TAIL)[0]
    inside, tails = _given(ms[keep], band[keep], edge[keep], share[:, None])
    p, f = (pm[:, keep] * inside).sum(axis=1), (pm[:, keep] * tails).sum(axis=1)
    return (float(p[0]), float(f[0])) if scalar else (p, f)


def rate_edges(ns: Any, threshold: float, confidence: float = 0.95, verdicts: int = 1) -> tuple[Any, Any]:
    """For each n in ``ns``: the largest count :func:`rate_rule` passes (it passes k <= top; -1 where none) and
    the least it fails (it fails k >= low; n + 1 where none), by bisection on the rule (its bounds rise with k)."""
    np, _ = _scipy()
    ns = np.asarray(ns, dtype=int)
    top, _ = _bisect(ns, np.full_like(ns, -1), ns + 1, lambda k: rate_rule(k, ns, threshold, confidence, verdicts)[0])
    _, low = _bisect(ns, np.full_like(ns, -1), ns + 1,
                     lambda k: ~rate_rule(k, ns, threshold, confidence, verdicts)[1])
    return top, low


def rate_chances(n: Any, rate: Any, threshold: float, confidence: float = 0.95, verdicts: int = 1) -> tuple[Any, Any]:
    """(P(pass), P(fail)) of :func:`rate_rule` on ``n`` units at a true ``rate``, exactly: one binomial tail each
    (:func:`rate_edges`). Floats for scalars; arrays over an array of n or of rates."""
    np, stats = _scipy()
    top, low = rate_edges(np.atleast_1d(n), threshold, confidence, verdicts)
    nn, r = np.atleast_1d(n), np.asarray(rate, dtype=float)
    if np.ndim(n) == 0:
        top, low, nn = top[0], low[0], nn[0]
    p = np.where(top >= 0, stats.binom.cdf(top, nn, r), 0.0)
    f = np.where(low <= nn, stats.binom.sf(low - 1, nn, r), 0.0)
    return (float(p), float(f)) if np.ndim(p) == 0 else (p, f)


def verdict_chance(claim: Claim | str, n: int, discordance: float,
                   thresholds: Mapping[str, float] | None = None) -> float | None:
    """The chance that ``claim`` reaches a verdict (pass or fail) on ``n`` units, per precision, when a share
    ``discordance`` of them disagree and nothing truly moves (matched_construction: the label discordance,
    accuracy unmoved; a rate claim: the true rate): :meth:`Claim.verdict_chance` with the claim's default
    thresholds overridden by ``thresholds``. None for a claim without a statistical rule (an exactness claim
    decides on counts: :meth:`Claim.least_evidence`)."""
    from pytest_kvaudit.claims.base import get

    c = get(claim) if isinstance(claim, str) else claim
    from pytest_kvaudit.core.model.config import AuditConfig

    return c.verdict_chance(n, discordance, c.resolve(AuditConfig(), thresholds or {}))


def least_n_holding(chances: Callable[[Any], Any], target: float = TARGET, start: int = 1,
                    limit: int = PROVEN_UP_TO) -> int | None:
    """The least n in [start, limit] whose chance is at least ``target`` and stays there up to ``limit``, given
    ``chances(ns)``, the chance at each n of an array (:func:`matched_curve`): a scan, since a discrete count's
    chance ripples with n (the least n that reaches it may fall below it again); None where the chance at
    ``limit`` is below the target."""
    np, _ = _scipy()
    ns = np.arange(start, limit + 1)
    below = np.nonzero(np.asarray(chances(ns)) < target)[0]
    if below.size and below[-1] == ns.size - 1:
        return None
    return int(ns[below[-1] + 1]) if below.size else int(start)


def items_for(units: int | None, rates: Mapping[str, float]) -> int | None:
    """The items that give ``units`` units at the calibrated eligibility rate (eligible units per item); None where
    no number of items does."""
    eligible = rates.get("eligible_items_per_precision", 1.0)
    return None if units is None or eligible <= 0 else math.ceil(units / eligible - 1e-9)


def units_for_equivalence(discordance: float, margin: float, confidence: float = 0.95, target: float = TARGET,
                          limit: int = PROVEN_UP_TO) -> int | None:
    """The least pairs, up to ``limit``, from which matched_construction passes with at least a ``target``
    chance at no true move when a share ``discordance`` of pairs disagree (half each way): 61 at no
    discordance and ±6 points, where Tango's interval is ±z²/(n+z²); None past ``limit``."""
    return _units_for_equivalence(round(discordance, 12), margin, confidence, target, limit)


@lru_cache(maxsize=256)
def _units_for_equivalence(discordance: float, margin: float, confidence: float, target: float,
                           limit: int) -> int | None:
    return least_n_holding(lambda ns: matched_curve(ns, discordance, 0.0, margin, confidence)[0], target, 2, limit)


def units_for_rate(rate: float, threshold: float, confidence: float = 0.95, target: float = TARGET,
                   limit: int = PROVEN_UP_TO) -> int | None:
    """The least units, up to ``limit``, from which a rate claim passes with at least a ``target`` chance at a
    true ``rate`` (183 at 0 and 2%); None when none does (a rate at or above the threshold passes at most
    alpha of runs)."""
    if rate >= threshold:
        return None
    return least_n_holding(lambda ns: rate_chances(ns, rate, threshold, confidence)[0], target, 1, limit)
