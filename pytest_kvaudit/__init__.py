"""kvaudit: does an LLM's KV cache survive stage replay? Claims as pytest assertions.

Importing this package is cheap: torch and transformers load only when a store computes.
"""

from __future__ import annotations

__version__ = "0.1.0"

from pytest_kvaudit.core.errors import KvauditError, UnsupportedCacheError
from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule

__all__ = ["AuditConfig", "BoundaryRule", "KvauditError", "UnsupportedCacheError", "__version__"]
