"""Model engines behind one protocol (:mod:`pytest_kvaudit.core.model.engine_protocol`), each one record
(:class:`pytest_kvaudit.core.engine.record.EngineSpec`) found by name (``--kvaudit-backend``); an engine's own
modules are imported when its record is loaded, the engine itself when its opener runs."""

from __future__ import annotations

from pytest_kvaudit.core.model.engine_protocol import Backend, OpenSpec
from pytest_kvaudit.core.model.engines import engine

__all__ = ["Backend", "OpenSpec", "open_backend"]


def open_backend(name: str, model: str, dtype: str, device: str = "auto", attn: str | None = None,
                 **settings: bool | str | None) -> Backend:
    """The model opened by engine ``name`` (its record's opener), for scripts and notebooks that name the engine,
    the model and the precision: ``settings`` are :class:`OpenSpec`'s other fields. A run opens its model through
    its config's record instead (:attr:`pytest_kvaudit.core.model.config.AuditConfig.engine`)."""
    return engine(name).opener(OpenSpec(model, dtype, device, attn, **settings))  # type: ignore[arg-type]
