"""The bridge: token-by-token incremental replay of the recorded ids equals the live cache, bit for bit."""

import pytest


@pytest.mark.kvaudit_claim("bridge_bitexact", min_units=12)
def test_bridge_bitexact(kvaudit_judge):
    kvaudit_judge.claim()
