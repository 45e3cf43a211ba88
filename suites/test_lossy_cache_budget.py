"""Lossy caches (--kvaudit-cache=quantized:...) change labels within a budget against the exact cache; an
offloaded cache equals the resident one bit for bit. Skipped, saying why, when no such kind is asked for."""

import pytest


@pytest.mark.kvaudit_claim("lossy_cache_budget")
def test_lossy_cache_budget(kvaudit_judge):
    kvaudit_judge.claim()
