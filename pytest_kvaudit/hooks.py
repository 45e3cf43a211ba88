"""kvaudit's own hooks, for a conftest or plugin to implement."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_kvaudit_faults(config: pytest.Config) -> Any:
    """Return a :class:`pytest_kvaudit.core.runtime.decoder.Faults` to inject deliberate faults into this run's
    computation (self-tests prove with it that each claim can fail). Runs on every process that computes."""
