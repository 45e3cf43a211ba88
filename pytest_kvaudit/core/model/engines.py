"""The engines kvaudit can audit (``--kvaudit-backend``), found by name: each one record
(:class:`pytest_kvaudit.core.engine.record.EngineSpec`, read through the :class:`.engine_protocol.Engine` protocol):
how to open it, the constructions it builds by its own means, whether it runs forwards on a caller's state or
serves requests, its cell builder and calibrator, the state reader its cells use, what it lacks and the lines it
adds to the report. The name is turned into the record once, when a run's config is built
(:class:`pytest_kvaudit.core.model.config.AuditConfig`); everything below reads the record.

Engines are found the way pytest finds its plugins: through the ``kvaudit.engines`` entry-point group (the
built-in three are declared in ``pyproject.toml`` like any third party's), or by :func:`register_backend` from
the layer that owns them (a plugin, a conftest). An entry point's name is known without loading it, so a config
is checked on a machine that lacks the engine; its record is loaded when a run asks about it, and the engine
itself (torch, llama.cpp, vLLM) only when the record's opener runs. This module names no higher layer: the
records hold the callables, and whoever registers them imports them."""

from __future__ import annotations

from importlib import metadata

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model import engine_constructions  # noqa: F401  (their schedules, for pricing)
from pytest_kvaudit.core.model.engine_protocol import Engine

__all__ = ["ANALYSES", "CAPABILITIES", "GROUP", "check", "engine", "find", "known", "register_backend"]

#: the entry-point group engines are declared in (``[project.entry-points."kvaudit.engines"]``)
GROUP = "kvaudit.engines"
#: analyses a claim may read or quote (``Claim.analyses``), computed when one does
ANALYSES = ("layer_sweep", "batch_invariance")
#: the needs an engine may lack (:attr:`EngineSpec.lacks`): the analyses, and per-layer K/V
CAPABILITIES = (*ANALYSES, "per_layer")
LACKABLE = frozenset(CAPABILITIES)


_REGISTERED: dict[str, Engine] = {}


def is_record(spec: object) -> bool:
    """Whether ``spec`` is an engine's record (it has every field of :class:`.engine_protocol.Engine`)."""
    return isinstance(spec, Engine)


def register_backend(spec: Engine) -> Engine:
    """Make ``--kvaudit-backend=spec.name`` run ``spec`` (replacing an entry point of that name); returns it."""
    if not is_record(spec):
        raise KvauditError(f"register_backend takes an EngineSpec, not {type(spec).__name__}: build one with "
                           "pytest_kvaudit.core.engine.EngineSpec(name, opener, ...)")
    _REGISTERED[spec.name] = spec
    return spec


def _entry_points() -> dict[str, metadata.EntryPoint]:
    return {ep.name: ep for ep in metadata.entry_points(group=GROUP)}


def known() -> list[str]:
    """Every engine's name: registered or declared by an entry point (none loaded)."""
    return sorted(set(_REGISTERED) | set(_entry_points()))


def check(name: str) -> str:
    if name not in _REGISTERED and name not in _entry_points():
        if not known():  # an install whose metadata predates the entry points (an old editable install)
            raise KvauditError(f"--kvaudit-backend={name!r}: no engine is registered under the {GROUP!r} entry "
                               "points; reinstall pytest-kvaudit (pip install -e . in a checkout) so they are")
        raise KvauditError(f"--kvaudit-backend={name!r} is not a known backend: use {', '.join(known())}")
    return name


def engine(name: str) -> Engine:
    """The record of engine ``name``, its entry point loaded the first time it is asked for."""
    if name not in _REGISTERED:
        ep = _entry_points().get(check(name))
        assert ep is not None
        spec = ep.load()
        if not is_record(spec) or spec.name != name:
            raise KvauditError(f"entry point {ep.value!r} ({GROUP} {name!r}) is not an EngineSpec named {name!r}: "
                               "point it at one")
        _REGISTERED[name] = spec
    return _REGISTERED[name]


def find(name: str | None) -> Engine | None:
    """The record of ``name``, or None where this installation does not know it (a report from elsewhere)."""
    try:
        return engine(name) if name else None
    except KvauditError:
        return None
