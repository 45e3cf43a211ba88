"""Which layers carry the divergence: transplant single layers, the first or last j, K only, V only.

Passes when the all-layer transplant is followed on every swept unit (the claim); the figures hold the
descriptive sweep and the smallest layer set that is sufficient on every unit.
"""

import pytest


@pytest.mark.kvaudit_claim("layer_sweep")
def test_layer_sweep(kvaudit_judge):
    kvaudit_judge.claim()
