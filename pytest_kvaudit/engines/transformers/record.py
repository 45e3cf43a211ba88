"""The transformers engine's record (:class:`~pytest_kvaudit.core.engine.record.EngineSpec`), declared as the
``transformers`` entry point of the ``kvaudit.engines`` group in ``pyproject.toml``."""

from __future__ import annotations

from pytest_kvaudit.core.engine.record import EngineSpec
from pytest_kvaudit.engines.transformers import backend

__all__ = ["TRANSFORMERS"]

#: a forward-level engine: the record's defaults are its cell builder, calibration, state reader and cache probes
TRANSFORMERS = EngineSpec("transformers", backend.open_spec)
