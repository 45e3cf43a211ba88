"""The saved ledger reproduces: every recorded trajectory and fingerprint comes back bit for bit.

``pytest suites --snapshot-update`` records the ledger under snapshots/<model-slug>/; a plain run audits.
"""

import pytest


@pytest.mark.kvaudit_claim("ledger_audit")
def test_ledger_audit(kvaudit_judge, snapshot):
    kvaudit_judge.claim(snapshot=snapshot)
