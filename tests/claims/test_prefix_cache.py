"""The prefix-cache verdict on hand-built records (no engine): one whole-block counterexample fails it, a unit
without cached tokens is never a hit, partial and cross-request changes are counted against live and cold with
intervals, the terminal's one line, and an engine without a prefix cache is skipped, saying why."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.claims.base import Evidence, get
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.records import CellRecord, Continuation

CFG = AuditConfig(backend="vllm", dtypes=("bf16",))


def cont(suffix: tuple[int, ...], label: bool = True, reused: int | None = None) -> Continuation:
    return Continuation(suffix, "s", "l", "7" if label else "8", label, reused=reused)


def unit(i: int, whole: dict[str, Any] | None, warm: int = 32, cross: int = 32, warm_suffix: tuple[int, ...] = (1, 2),
         cross_label: bool = True) -> CellRecord:
    r = CellRecord(f"t{i}", "bf16", (5,) * 20, (1,) * 30, 20, None, "7")
    r.constructions = {"live": cont((1, 2)), "prefill": cont((1, 3)), "warm": cont(warm_suffix, reused=warm),
                       "cross": cont((1, 2), cross_label, reused=cross)}
    if whole is not None:
        r.requests["warm:block"] = whole
    r.comparison.first_difference = {"warm_vs_live": {"layer": 2, "position": 33} if warm_suffix != (1, 2) else None}
    return r


HIT = {"num_cached_tokens": 32, "boundary": 13, "blocks_equal": True, "suffix_equal": True, "logits_equal": True,
       "first_difference": None}


def judge(records: list[CellRecord], min_units: int = 2) -> Any:
    claim = get("prefix_cache")
    return claim.judge(Evidence(records, claim.resolve(CFG, {"min_units": min_units}), CFG))


def test_whole_block_hits_that_reproduce_pass_and_partial_changes_are_counted() -> None:
    r = judge([unit(0, HIT), unit(1, HIT, warm_suffix=(9, 9)), unit(2, HIT, cross_label=False)])
    assert (r.status, r.n, r.k) == ("pass", 3, 3), r.reason
    f = r.figures["per_dtype"]["bf16"]
    assert f["partial"]["suffix_changes_vs_live"] == [1, 3] and f["partial"]["suffix_changes_vs_cold"] == [3, 3]
    assert f["partial"]["first_difference"]["first_layer"] == {"2": 1}
    assert f["cross_request"]["label_changes_vs_live"] == [1, 3] and f["cross_request"]["cached_tokens"] == 96
    lo, hi = f["partial"]["suffix_changes_vs_live_ci"]
    assert 0 < lo < 1 / 3 < hi < 1
    assert r.figures["lines"] == ["prefix cache (bf16): whole-block hits reproduce 3/3; partial hits change 1/3 "
                                  f"suffixes (33% [{lo:.0%}, {hi:.0%}]), 0 labels; cross-request hits change 0/3 "
                                  f"suffixes (0% [0%, {f['cross_request']['suffix_changes_vs_live_ci'][1]:.0%}]), 1 "
                                  "labels"]
    assert get("prefix_cache").key_figure(r) == r.figures["lines"][0]


def test_one_whole_block_counterexample_fails_it() -> None:
    bad = {**HIT, "blocks_equal": False, "first_difference": {"layer": 1, "position": 3}}
    r = judge([unit(0, HIT), unit(1, bad), unit(2, HIT)])
    assert (r.status, r.n, r.k, r.counterexamples) == ("fail", 3, 2, ["t1@bf16"])
    assert "t1@bf16 (blocks (layer 1, position 3))" in r.reason
    r = judge([unit(0, HIT), unit(1, {**HIT, "logits_equal": False})])
    assert r.status == "fail" and "logits" in r.reason


def test_a_unit_without_cached_tokens_is_never_a_hit() -> None:
    r = judge([unit(0, {**HIT, "num_cached_tokens": 0, "blocks_equal": False}, warm=0, cross=0),
               unit(1, {"num_cached_tokens": 0, "boundary": None, "reason": "no block edge"}, warm=0, cross=0)])
    f = r.figures["per_dtype"]["bf16"]
    assert (r.status, r.n) == ("inconclusive", 0) and f["whole_block"] == {"n": 0, "k": 0, "no_hit": 2}
    assert f["partial"]["n"] == 0 and f["partial"]["no_hit"] == 2 and f["cross_request"]["n"] == 0
    assert "no hits" in r.figures["lines"][0]


def test_an_engine_without_a_prefix_cache_is_skipped_and_one_without_blocks_is_inconclusive() -> None:
    claim = get("prefix_cache")
    assert "has no prefix cache" in (claim.applicable(AuditConfig()) or "")
    assert claim.applicable(CFG) is None
    llama = AuditConfig(backend="llama.cpp", dtypes=("bf16",))
    r = claim.judge(Evidence([unit(0, None)], claim.resolve(llama, {}), llama))
    assert r.status == "inconclusive" and "has no blocks" in r.reason
