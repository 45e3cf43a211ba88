"""Model engines behind one protocol (:mod:`pytest_kvaudit.core.model.engine_protocol`), each one record
(:class:`pytest_kvaudit.core.model.engines.EngineSpec`) found by name (``--kvaudit-backend``); an engine's own
modules are imported when its record is loaded, the engine itself when its opener runs."""

from __future__ import annotations

from pytest_kvaudit.core.model.engine_protocol import Backend, OpenSpec
from pytest_kvaudit.core.model.engines import engine

__all__ = ["Backend", "OpenSpec", "open_backend", "open_engine"]


def open_engine(name: str, spec: OpenSpec) -> Backend:
    """``spec`` opened by the engine ``name``."""
    return engine(name).opener(spec)


def open_backend(name: str, model: str, dtype: str, device: str = "auto", attn: str | None = None,
                 **settings: bool | str | None) -> Backend:
    """:func:`open_engine` for scripts and notebooks that name the model and precision:
    ``settings`` are :class:`OpenSpec`'s other fields."""
    return open_engine(name, OpenSpec(model, dtype, device, attn, **settings))  # type: ignore[arg-type]
