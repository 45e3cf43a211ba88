"""Model engines behind one protocol (:mod:`pytest_kvaudit.core.model.engine_protocol`), chosen by name
(``--kvaudit-backend``, :mod:`pytest_kvaudit.core.model.engines`) and imported only when chosen."""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any

from pytest_kvaudit.core.model.engine_protocol import Backend
from pytest_kvaudit.core.model.engines import opener as _opener

__all__ = ["Backend", "open_backend"]


def open_backend(name: str, spec: str, dtype: str, device: str = "auto", attn: str | None = None,
                 trust_remote_code: bool = False, allow_pickle: bool = False, device_map: str | None = None,
                 engine_args: Mapping[str, str] | None = None) -> Backend:
    """``spec`` loaded at ``dtype`` by the backend ``name``; ``engine_args`` (``--kvaudit-engine-arg``) go to an
    engine that takes them (vLLM's ``LLM``), and only there."""
    opener: Any = _opener(name)
    if isinstance(opener, str):
        module, fn = opener.split(":")
        opener = getattr(import_module(module), fn)
    extra = {"engine_args": dict(engine_args)} if engine_args else {}
    backend: Backend = opener(spec, dtype, device, attn, trust_remote_code, allow_pickle, device_map, **extra)
    return backend
