"""Every decision rule's size is at most its alpha, proven by exact enumeration over the tested grid (n from 20
to 400, discordant counts from 0 to 30 and beyond, true rates at, below and above each threshold), with its
power at stated alternatives; and the same proof flags the rules it replaced (the percentile bootstrap,
Newcombe's interval at the boundary, Wilson's lower bound), so it can fail.

Sizes are the exact probabilities of the verdict under the null, summed over every table that carries
probability (:mod:`pytest_kvaudit.claims.power`); one seeded simulation checks the enumeration itself.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from pytest_kvaudit.claims.power import (
    fail_edge,
    matched_chances,
    matched_rule,
    pass_band,
    rate_chances,
    rate_pass_chance,
    units_for_equivalence,
    units_for_rate,
)
from pytest_kvaudit.claims.stats import (
    clopper_pearson_interval,
    mcnemar_counts,
    mcnemar_p_array,
    rate_bounds_array,
    rate_decision,
    tango_interval,
    wilson_interval,
)

ALPHA = 0.05
HALF = ALPHA / 2  # each end of a two-sided 95% interval is a one-sided test at 2.5%
MARGIN = 0.06
NS = (20, 50, 100, 150, 197, 200, 300, 400)


def test_mcnemar_p_is_scipys_binomial_test() -> None:
    for m in range(0, 31):
        for b in range(m + 1):
            want = 1.0 if m == 0 else stats.binomtest(b, m, 0.5).pvalue
            assert float(mcnemar_p_array(b, m)) == pytest.approx(want, rel=1e-9, abs=1e-12)
            assert mcnemar_counts(b, m - b) == pytest.approx(want, rel=1e-12)


def test_mcnemar_conditional_size_is_at_most_alpha_at_every_discordant_count() -> None:
    # given m discordant pairs and no difference, b ~ Binomial(m, 1/2): the chance of FAIL, exactly
    for m in range(0, 401):
        b = np.arange(m + 1)
        size = float((stats.binom.pmf(b, m, 0.5) * (mcnemar_p_array(b, np.full_like(b, m)) < ALPHA)).sum())
        assert size <= ALPHA, (m, size)
    assert mcnemar_counts(4, 0) == 0.125  # SmolLM2's 4:0 is not a move


def tango_size(n: int, discordance: float, sign: int) -> float:
    """P(PASS) when the true accuracy difference sits on the margin (the equivalence null's edge)."""
    return matched_chances(n, discordance, sign * MARGIN, MARGIN)[0]


@pytest.mark.parametrize("n", NS)
def test_matched_pass_size_is_at_most_half_alpha_on_the_margin(n: int) -> None:
    # the discordance is the table's only nuisance parameter; from the margin itself (every discordant pair one
    # way, the boundary where Newcombe's interval breaks) to 0.5
    for d in (0.06, 0.07, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5):
        for sign in (1, -1):
            assert tango_size(n, d, sign) <= HALF, (n, d, sign)


def test_matched_fail_size_holds_unconditionally_too() -> None:
    # no difference, any discordance: McNemar's conditional bound holds on average as well
    for n in (20, 100, 400):
        for d in (0.0, 0.02, 0.127, 0.5):
            assert matched_chances(n, d, 0.0, MARGIN)[1] <= ALPHA


def test_matched_power_at_stated_alternatives() -> None:
    # SmolLM2's n and discordance (197 pairs, 12.7% of suffixes divergent)
    pass0, fail0 = matched_chances(197, 0.127, 0.0, MARGIN)
    _, fail6 = matched_chances(197, 0.127, MARGIN, MARGIN)
    _, fail3 = matched_chances(197, 0.127, 0.03, MARGIN)
    assert 0.20 < pass0 < 0.27 and fail0 < 0.035  # equivalence is hard to show at this n
    assert 0.55 < fail6 < 0.65 and 0.12 < fail3 < 0.20  # a move of the margin is caught most of the time
    # with nothing discordant, Tango's interval is ±z²/(n+z²): a pass needs 61 pairs at ±6 points
    assert matched_chances(60, 0.0, 0.0, MARGIN)[0] == 0.0 and matched_chances(61, 0.0, 0.0, MARGIN)[0] == 1.0
    assert units_for_equivalence(0.0, MARGIN) == 61


@pytest.mark.parametrize("n", [20, 61, 200])
def test_the_pass_band_and_mcnemars_edge_are_the_rule_on_every_table(n: int) -> None:
    # the enumeration sums the rule over a band of b a discordant count: the band is the rule, table by table
    b, c = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = b + c <= n
    b, c = b[keep], c[keep]
    passes, fails = matched_rule(b, c, n, MARGIN)
    m = b + c
    band = pass_band(np.arange(n + 1), n, MARGIN)[m]
    edge = fail_edge(np.arange(n + 1), ALPHA)[m]
    assert np.array_equal(passes, (m - band <= b) & (b <= band))
    assert np.array_equal(fails, (b >= edge) | (b <= m - edge))


def test_the_enumeration_agrees_with_a_seeded_simulation() -> None:
    rng = np.random.default_rng(37)
    n, d, delta = 197, 0.127, 0.03
    draws = rng.multinomial(n, [(d + delta) / 2, (d - delta) / 2, 1 - d], size=20000)
    passes, fails = matched_rule(draws[:, 0], draws[:, 1], n, MARGIN)
    want_pass, want_fail = matched_chances(n, d, delta, MARGIN)
    se = 4 * np.sqrt(0.25 / len(draws))
    assert abs(passes.mean() - want_pass) < se and abs(fails.mean() - want_fail) < se


def test_the_plans_strict_n_gives_an_80_percent_chance_in_a_seeded_simulation() -> None:
    # SmolLM2's bf16 discordance: the strict n from the enumeration, then a simulation at that n and 10% below
    d = 25 / 197
    n = units_for_equivalence(d, MARGIN)
    assert n is not None
    rng = np.random.default_rng(4)

    def simulated(k: int) -> float:
        x = rng.multinomial(k, [d / 2, d / 2, 1 - d], size=8000)
        return float(matched_rule(x[:, 0], x[:, 1], k, MARGIN)[0].mean())

    assert simulated(n) >= 0.8 - 0.02
    assert simulated(int(n * 0.9)) < 0.8  # the least such n, within 10%


def test_tango_reproduces_the_figures_and_keeps_its_width_at_zero_discordance() -> None:
    lo, hi = tango_interval(4, 0, 197)
    assert (round(lo * 100, 2), round(hi * 100, 2)) == (0.08, 5.10)
    lo, hi = tango_interval(11, 9, 200)  # the paper's counts: inside ±6 points, as its bootstrap CI was
    assert -MARGIN < lo < -0.03 and 0.05 < hi < MARGIN
    z2 = stats.norm.ppf(0.975) ** 2
    for n in (20, 200):
        lo, hi = tango_interval(0, 0, n)
        assert hi == pytest.approx(z2 / (n + z2), abs=1e-9) and lo == pytest.approx(-hi)
    assert tango_interval(0, 0, 200)[1] == pytest.approx(wilson_interval(0, 200)[1], abs=1e-9)


def percentile_bootstrap_fails(b: int, n: int, resamples: int = 4000, seed: int = 0) -> bool:
    """The old rule on a b:0 table: FAIL when the percentile bootstrap CI of the difference excludes 0."""
    diffs = np.random.default_rng(seed).binomial(n, b / n, size=resamples) / n  # a b:0 table's resampled diff
    return bool(np.quantile(diffs, 0.025) > 0)


def test_the_proof_flags_the_rules_it_replaced() -> None:
    # the bootstrap failed every k:0 table with k >= 4; the exact test fails none below 6
    assert percentile_bootstrap_fails(4, 197)
    assert not matched_rule(4, 0, 197, MARGIN)[1] and not matched_rule(5, 0, 197, MARGIN)[1]
    assert matched_rule(6, 0, 197, MARGIN)[1]
    # a zero-width interval at zero discordance "passes" 20 pairs; Tango's does not
    assert not matched_rule(0, 0, 20, MARGIN)[0]
    # Wilson's lower bound as the FAIL rule: 10% size at 27 units and a true 2%, where Clopper-Pearson holds
    k = np.arange(28)
    pm = stats.binom.pmf(k, 27, 0.02)
    wilson_fail = sum(p for i, p in zip(k, pm) if wilson_interval(int(i), 27)[0] > 0.02)
    exact_fail = sum(p for i, p in zip(k, pm) if clopper_pearson_interval(int(i), 27)[0] > 0.02)
    assert wilson_fail > ALPHA and exact_fail <= HALF


def test_the_rate_rule_is_symmetric_and_its_size_holds_at_every_n() -> None:
    for n in range(20, 401):
        pas, fail = rate_chances(n, 0.02, 0.02)  # at the threshold, both nulls' edge
        assert pas <= HALF and fail <= HALF, (n, pas, fail)
        assert rate_chances(n, 0.03, 0.02)[0] <= pas + 1e-12  # above it, passing is rarer
        assert rate_chances(n, 0.01, 0.02)[1] <= fail + 1e-12  # below it, failing is rarer
    # the old rule failed on the point estimate: 13.7% of runs at a true 1% (half the limit), n = 197
    assert rate_chances(197, 0.01, 0.02)[1] < 0.01
    # power: 0/200 passes (the paper), a true 6% fails most runs of 200
    assert rate_decision(0, 200, 0.02)[0] == "pass" and rate_chances(200, 0.06, 0.02)[1] > 0.8
    assert units_for_rate(0.0, 0.02) == 189 and units_for_rate(0.02, 0.02) is None
    assert rate_pass_chance(189, 0.0, 0.02) == 1.0


def test_the_vectorised_bounds_are_the_scalar_ones() -> None:
    for n in (20, 197, 400):
        lower, upper = rate_bounds_array(np.arange(n + 1), n)
        for k in range(0, n + 1, 11):
            assert lower[k] == pytest.approx(clopper_pearson_interval(k, n)[0], abs=1e-12)
            assert upper[k] == pytest.approx(wilson_interval(k, n)[1], abs=1e-12)
