"""The decision rules: one framework per claim, each verdict one side of one interval, and the version that
names them in every report (``rules_version``).

- **A rate against a threshold** (fixed_prefix_2x2's FP32 disagreements, a lossy cache's label changes,
  :func:`rate_rule`): PASS when the Clopper-Pearson upper bound (one-sided 97.5%) is at or below the threshold,
  FAIL when the Clopper-Pearson lower bound is above it, else inconclusive. Both bounds are exact, so each
  verdict's size is at most its alpha at every n by construction (0/183 is the least that clears 2%; Wilson's
  upper bound, the paper's figure, is reported beside it and never decides: its PASS side reaches 0.0264 at a
  true 10% and n = 84).
- **An accuracy difference within a margin** (matched_construction, :func:`matched_rule`), the equivalence
  form: PASS when Tango's paired score interval lies within ±margin, FAIL when it lies wholly outside,
  inconclusive in between. The interval is asymptotic, and at its nominal z its sizes exceed alpha off a grid
  of n (PASS 0.02567 at n = 258; FAIL 0.052 at n = 80), so its z is calibrated (:data:`TANGO_Z`): the least
  z, in steps of 0.01, at which the verdict's size is at most its alpha at every n from 20 to 1,000 pairs, at
  a true difference of ±margin and every discordance from the margin (every discordant pair one way) to 1 in
  steps of 0.01 (``benchmarks/decision_rules.py`` enumerates every n; the tests every n up to 400 and the worst
  beyond). The exact McNemar p and whether the interval excludes 0 are figures, never the verdict.

**Claim-level sizes.** A claim passes only when every one of its verdicts passes (an intersection-union test:
its PASS size is that of one verdict), and fails when any fails: so each FAIL verdict is judged at alpha split
over the claim's verdicts of that rule (``verdicts``: precisions, or lossy kinds x precisions), and the claim's
FAIL size stays at most alpha (Bonferroni).
"""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.claims.stats import _scipy, tango_statistic

#: which rules judged a report: 1 before issue 37 (point estimates, the bootstrap), 2 issue 37 (McNemar FAIL,
#: Tango PASS, Wilson rates), 3 issue 45 (this module)
RULES_VERSION = 3
#: the pairs up to which :data:`TANGO_Z` is proven (the built-in item generator's maximum)
PROVEN_UP_TO = 1000
#: the least pairs the proof starts from (matched_construction's ``min_units``)
PROVEN_FROM = 20
#: Tango's z calibrated per (verdict, margin, one-sided alpha): PASS at alpha (0.025), FAIL at alpha over 1 to 4
#: verdicts (precisions). The FAIL side needs the larger z: at a true difference of the margin with nearly every
#: discordant pair one way, the interval's far end behaves like Wilson's lower bound, which is too high
TANGO_Z: dict[tuple[str, float, float], float] = {
    ("pass", 0.06, 0.025): 1.97,
    ("fail", 0.06, 0.025): 2.31,
    ("fail", 0.06, 0.0125): 2.62,
    ("fail", 0.06, 0.008333): 2.77,
    ("fail", 0.06, 0.00625): 2.89,
}


def one_sided_alpha(confidence: float) -> float:
    """Each verdict's alpha: one end of a two-sided interval at ``confidence`` (2.5% at 95%)."""
    return (1 - confidence) / 2


def tango_z(verdict: str, margin: float, alpha: float) -> tuple[float, bool]:
    """Tango's z for a ``verdict`` ("pass" or "fail") of one-sided ``alpha`` at ``margin``, and whether it is
    calibrated (proven at every n from 20 to 1,000); the nominal normal quantile for thresholds nobody
    calibrated."""
    z = TANGO_Z.get((verdict, round(margin, 6), round(alpha, 6)))
    if z is not None:
        return z, True
    _, stats = _scipy()
    return float(stats.norm.isf(alpha)), False


def matched_zs(margin: float, confidence: float = 0.95, verdicts: int = 1) -> tuple[float, float, bool]:
    """(PASS z, FAIL z, both calibrated) of :func:`matched_rule`."""
    alpha = one_sided_alpha(confidence)
    zp, cp = tango_z("pass", margin, alpha)
    zf, cf = tango_z("fail", margin, alpha / max(1, verdicts))
    return zp, zf, cp and cf


def matched_rule(b: Any, c: Any, n: Any, margin: float, confidence: float = 0.95,
                 verdicts: int = 1) -> tuple[Any, Any]:
    """(passes, fails) over tables of ``n`` pairs, ``b`` right only on the first side and ``c`` only on the
    second: Tango's interval at the PASS z lies within [-margin, +margin]; at the FAIL z (alpha over
    ``verdicts``) it lies wholly outside. Read from the score statistic at ±margin (it falls as the difference
    grows, so the interval's end is inside the margin exactly when the statistic there is beyond ∓z)."""
    np, _ = _scipy()
    zp, zf, _ = matched_zs(margin, confidence, verdicts)
    b, c, n = (np.asarray(x, dtype=float) for x in (b, c, n))
    at_plus, at_minus = tango_statistic(b, c, n, margin), tango_statistic(b, c, n, -margin)
    passes = (at_plus <= -zp) & (at_minus >= zp)
    fails = (at_plus > zf) | (at_minus < -zf)
    return passes, fails


def cp_bounds(k: Any, n: Any, alpha_upper: float, alpha_lower: float) -> tuple[Any, Any]:
    """(lower, upper) one-sided Clopper-Pearson bounds of k/n: the lower at one-sided ``alpha_lower``, the
    upper at ``alpha_upper`` (0 at k = 0, 1 at k = n)."""
    np, _ = _scipy()
    from scipy.special import betaincinv  # the beta quantile without scipy.stats' checks: the scans call it often

    k, n = np.asarray(k, dtype=float), np.asarray(n, dtype=float)
    lower = np.where(k > 0, betaincinv(np.maximum(k, 1), n - k + 1, alpha_lower), 0.0)
    upper = np.where(k < n, betaincinv(k + 1, np.maximum(n - k, 1), 1 - alpha_upper), 1.0)
    return lower, upper


def rate_rule(k: Any, n: Any, threshold: float, confidence: float = 0.95,
              verdicts: int = 1) -> tuple[Any, Any, Any, Any]:
    """(passes, fails, lower, upper) over counts ``k`` of ``n``: PASS when the Clopper-Pearson upper bound
    (one-sided alpha) is at or below ``threshold``, FAIL when the lower bound (one-sided alpha over
    ``verdicts``) is above it."""
    alpha = one_sided_alpha(confidence)
    lower, upper = cp_bounds(k, n, alpha, alpha / max(1, verdicts))
    return upper <= threshold, lower > threshold, lower, upper


def rate_decision(k: int, n: int, threshold: float, confidence: float = 0.95,
                  verdicts: int = 1) -> tuple[str, float, float]:
    """One rate verdict ("pass", "fail" or "inconclusive") with its (lower, upper) bounds; nothing judged is
    inconclusive."""
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return ("inconclusive", 0.0, 1.0)
    passes, fails, lower, upper = rate_rule(k, n, threshold, confidence, verdicts)
    return ("pass" if passes else "fail" if fails else "inconclusive", float(lower), float(upper))


def least_units_below(threshold: float, k: int = 0, confidence: float = 0.95, limit: int = 10**7) -> int | None:
    """The least n at which k of n has a Clopper-Pearson upper bound at or below ``threshold`` (it falls as n
    grows with k fixed): 183 at 0 and 2% (Wilson's was 189), 36 at 0 and 10%; None past ``limit``."""
    if threshold <= 0:
        return None

    def clears(n: int) -> bool:
        return bool(rate_rule(k, n, threshold, confidence)[0])

    lo, hi = k, max(k + 1, 1)
    while not clears(hi):
        lo, hi = hi, hi * 2
        if hi > limit:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if clears(mid) else (mid, hi)
    return hi
