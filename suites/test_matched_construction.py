"""Live cache vs one-shot prefill of the identical ids: suffixes move, accuracy does not."""

import pytest


@pytest.mark.kvaudit_claim("matched_construction", margin=0.06)
def test_matched_construction(kvaudit_judge):
    kvaudit_judge.claim()
