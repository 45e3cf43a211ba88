"""kvaudit: does an LLM's KV cache survive stage replay? Claims as pytest assertions.

Importing this package is cheap: pytest imports it with the plugin in every run of the venv, so the config's
classes load on first use (PEP 562), and torch and transformers only when a store computes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from pytest_kvaudit.core.errors import KvauditError, UnsupportedCacheError

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule

__all__ = ["AuditConfig", "BoundaryRule", "KvauditError", "UnsupportedCacheError", "__version__"]


def __getattr__(name: str) -> Any:
    if name in ("AuditConfig", "BoundaryRule"):
        from pytest_kvaudit.core.model import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
