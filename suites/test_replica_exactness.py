"""Replicas are exact: the same construction, precision and item computed twice is bit-identical."""

import pytest


@pytest.mark.kvaudit_claim("replica_exactness")
def test_replica_exactness(kvaudit_judge):
    kvaudit_judge.claim()
