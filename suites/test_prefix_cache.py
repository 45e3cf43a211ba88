"""An engine's prefix cache: whole-block hits continue bit for bit as the request that wrote the blocks; partial
and cross-request hits are counted against live and cold. Skipped, saying why, on an engine without one."""

import pytest


@pytest.mark.kvaudit_claim("prefix_cache")
def test_prefix_cache(kvaudit_judge):
    kvaudit_judge.claim()
