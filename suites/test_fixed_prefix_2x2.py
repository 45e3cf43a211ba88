"""Fixed prefix ids, construction x precision: BF16 disagreements recur, FP32 shows none."""

import pytest


@pytest.mark.kvaudit_claim("fixed_prefix_2x2", max_rate=0.02)
def test_fixed_prefix_2x2(kvaudit_judge):
    kvaudit_judge.claim()
