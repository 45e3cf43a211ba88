"""All-layer bidirectional K/V transplant: every divergent continuation follows its cache donor."""

import pytest


@pytest.mark.kvaudit_claim("donor_following")
def test_donor_following(kvaudit_judge):
    kvaudit_judge.claim()
