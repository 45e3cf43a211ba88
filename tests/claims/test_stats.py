"""The statistics reproduce the paper's figures from its counts, and behave as intervals must."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kvaudit.claims.stats import clopper_pearson_interval, mcnemar_exact, paired_bootstrap_ci, wilson_interval


def test_wilson_upper_bound_of_zero_in_200_is_the_papers_1_88_percent() -> None:
    lo, hi = wilson_interval(0, 200)
    assert lo == 0.0
    assert round(hi, 5) == 0.01885


def test_paired_bootstrap_reproduces_the_papers_accuracy_ci() -> None:
    # 200 paired labels: 11 right only with the live cache, 9 right only with prefill (diff = +1 point)
    live = [1] * 11 + [0] * 9 + [1] * 100 + [0] * 80
    prefill = [0] * 11 + [1] * 9 + [1] * 100 + [0] * 80
    lo, hi = paired_bootstrap_ci(live, prefill, confidence=0.95, n_resamples=10000, seed=0)
    assert (round(lo, 3), round(hi, 3)) == (-0.035, 0.055)


def test_bootstrap_is_seeded() -> None:
    a = [1, 0, 1, 1, 0, 1, 0, 0, 1, 1] * 5
    b = [0, 0, 1, 1, 1, 1, 0, 1, 1, 0] * 5
    assert paired_bootstrap_ci(a, b, seed=3) == paired_bootstrap_ci(a, b, seed=3)


def test_bootstrap_of_identical_labels_is_the_point_zero() -> None:
    assert paired_bootstrap_ci([1, 0, 1], [1, 0, 1]) == (0.0, 0.0)


def test_mcnemar_exact() -> None:
    a = [True] * 11 + [False] * 9
    b = [False] * 11 + [True] * 9
    assert mcnemar_exact(a, b) == pytest.approx(0.8238, abs=1e-4)
    assert mcnemar_exact([True, False], [True, False]) == 1.0
    assert mcnemar_exact([True] * 10, [False] * 10) < 0.01


@pytest.mark.parametrize("k,n", [(-1, 5), (6, 5), (0, -1)])
def test_bad_counts_are_refused(k: int, n: int) -> None:
    with pytest.raises(ValueError):
        wilson_interval(k, n)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=400).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
       st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_intervals_are_ordered_inside_unit_and_cover_the_estimate(kn: tuple[int, int], conf: float) -> None:
    k, n = kn
    for fn in (wilson_interval, clopper_pearson_interval):
        lo, hi = fn(k, n, conf)
        assert 0.0 <= lo <= k / n <= hi <= 1.0


@settings(max_examples=80, deadline=None)
@given(st.integers(min_value=2, max_value=300).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
def test_wilson_is_monotone_in_k(kn: tuple[int, int]) -> None:
    k, n = kn
    lo1, hi1 = wilson_interval(k, n)
    lo2, hi2 = wilson_interval(k + 1, n)
    assert lo2 >= lo1 and hi2 >= hi1


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans()), min_size=2, max_size=60))
def test_bootstrap_interval_holds_the_observed_difference(pairs: list[tuple[bool, bool]]) -> None:
    a = [int(x) for x, _ in pairs]
    b = [int(y) for _, y in pairs]
    lo, hi = paired_bootstrap_ci(a, b, n_resamples=2000)
    diff = (sum(a) - sum(b)) / len(a)
    assert -1.0 <= lo <= hi <= 1.0
    assert lo - 1e-9 <= diff <= hi + 1e-9
