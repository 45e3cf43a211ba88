"""An engine's record, as the core knows it: :class:`~.record.EngineSpec`, whose fields are the protocols of
:mod:`pytest_kvaudit.core.model.engine_protocol` with the forward-level parts filled in as their defaults. It sits
on top of the core because a record holds an engine's opener (runtime), its cell builder (compute) and its
calibrator (planning); the registry that finds records by name (:mod:`pytest_kvaudit.core.model.engines`) names
none of them. An engine of your own builds one ``EngineSpec`` and declares it as an entry point."""

from __future__ import annotations

from pytest_kvaudit.core.engine.record import EngineSpec
from pytest_kvaudit.core.model.engines import register_backend

__all__ = ["EngineSpec", "register_backend"]
