"""kvaudit's claims: one module per claim over :mod:`.base`, registered through the public API.

A user's claim does the same in their own test file::

    from pytest_kvaudit.claims import Claim, Threshold, register, PASS, FAIL

    @register
    class MyClaim(Claim):
        name = "my_claim"
        thresholds = {"min_units": Threshold(4, "least units")}
        def judge(self, ev): ...

and its test calls ``kvaudit_judge.claim("my_claim")``.
"""

from __future__ import annotations

from pytest_kvaudit.claims import (  # noqa: F401  (importing registers the built-in claims, in the paper's order)
    bridge_bitexact,
    donor_following,
    fixed_prefix_2x2,
    ledger_audit,
    lossy_cache_budget,
    matched_construction,
    prefix_cache,
    replica_exactness,
)
from pytest_kvaudit.claims.base import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    exact_result,
    get,
    least_units,
    register,
    registered,
)

__all__ = ["FAIL", "INCONCLUSIVE", "PASS", "Claim", "ClaimResult", "Evidence", "Threshold", "exact_result", "get",
           "least_units", "register", "registered"]
