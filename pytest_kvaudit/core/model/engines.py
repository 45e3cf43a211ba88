"""The engines kvaudit can audit, by name (``--kvaudit-backend``): where each one's opener lives, the
constructions it builds by its own means and the analyses it cannot run. Plain data, known without importing
any engine, so a config can be checked and a plan priced on a machine that lacks the engine; opening one is
:func:`pytest_kvaudit.core.runtime.backends.open_backend`, which imports the opener only when chosen, the way
pytest-benchmark picks a storage by its URL's scheme. A second engine is one module with an ``open_backend``
function and one entry here (or a call to :func:`register_backend` from a plugin or conftest)."""

from __future__ import annotations

from collections.abc import Callable

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model import engine_constructions  # noqa: F401  (their schedules, for pricing)
from pytest_kvaudit.core.model.engine_protocol import Backend

__all__ = ["backend_constructions", "check", "known", "lacks", "opener", "register_backend"]

#: name -> "module:function" (imported when chosen) or the opener itself
_BACKENDS: dict[str, str | Callable[..., Backend]] = {
    "transformers": "pytest_kvaudit.core.runtime.backends.transformers:open_backend",
    "llama.cpp": "pytest_kvaudit.core.runtime.backends.llamacpp:open_backend",
    "vllm": "pytest_kvaudit.core.runtime.backends.vllm:open_backend",
}
#: name -> the constructions the engine builds by its own means (:mod:`.engine_constructions`), run in every
#: cell under that backend after the schedules; known without importing the engine, so a plan can price them
_CONSTRUCTIONS: dict[str, tuple[str, ...]] = {"llama.cpp": ("warm", "restore"), "vllm": ("warm", "batched({batch})")}
#: name -> the analyses the engine cannot run (``layer_sweep``, ``batch_invariance``): never run, never priced
_LACKS: dict[str, frozenset[str]] = {"llama.cpp": frozenset({"per_layer", "layer_sweep", "batch_invariance"}),
                                     "vllm": frozenset({"layer_sweep", "batch_invariance"})}


def register_backend(name: str, opener: str | Callable[..., Backend], constructions: tuple[str, ...] = (),
                     lacks: frozenset[str] = frozenset()) -> None:
    """Make ``--kvaudit-backend=name`` open models with ``opener(spec, dtype, device, attn, trust_remote_code,
    allow_pickle, device_map)``; ``constructions`` are registered schedules the backend builds itself
    (``Backend.construct``), run in every cell under it; ``lacks`` the analyses it cannot run."""
    _BACKENDS[name] = opener
    _CONSTRUCTIONS[name] = tuple(constructions)
    _LACKS[name] = frozenset(lacks)


def lacks(name: str, what: str) -> bool:
    """Whether backend ``name`` cannot do ``what``: ``per_layer`` (its state is read whole, as bytes),
    ``layer_sweep``, ``batch_invariance``."""
    return what in _LACKS.get(name, frozenset())


def backend_constructions(name: str) -> tuple[str, ...]:
    """The constructions backend ``name`` builds by its own means (an empty tuple for transformers)."""
    return _CONSTRUCTIONS.get(name, ())


def known() -> list[str]:
    return sorted(_BACKENDS)


def check(name: str) -> str:
    if name not in _BACKENDS:
        raise KvauditError(f"--kvaudit-backend={name!r} is not a known backend: use {', '.join(known())}")
    return name


def opener(name: str) -> str | Callable[..., Backend]:
    """Where backend ``name`` is opened: ``"module:function"`` or the opener itself."""
    return _BACKENDS[check(name)]
