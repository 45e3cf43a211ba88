"""The engines kvaudit can audit (``--kvaudit-backend``), each one :class:`EngineSpec`: how to open it, the
constructions it builds by its own means, whether it runs forwards on a caller's state or serves requests, its
cell builder and calibrator, the state reader its cells use, what it lacks and the lines it adds to the report.

Engines are found the way pytest finds its plugins: through the ``kvaudit.engines`` entry-point group (the
built-in three are declared in ``pyproject.toml`` like any third party's), or by :func:`register_backend` from
the layer that owns them (a plugin, a conftest). An entry point's name is known without loading it, so a config
is checked on a machine that lacks the engine; its record is loaded when a run asks about it, and the engine
itself (torch, llama.cpp, vLLM) only when the record's opener runs. This module names no higher layer: the
records hold the callables, and whoever registers them imports them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Literal

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model import engine_constructions  # noqa: F401  (their schedules, for pricing)
from pytest_kvaudit.core.model.engine_protocol import Backend, OpenSpec
from pytest_kvaudit.core.model.precisions import named, torch_precisions

__all__ = ["ANALYSES", "CAPABILITIES", "GROUP", "EngineSpec", "backend_constructions", "check", "engine", "find",
           "known", "lacks", "register_backend"]

#: the entry-point group engines are declared in (``[project.entry-points."kvaudit.engines"]``)
GROUP = "kvaudit.engines"
#: analyses a claim may read or quote (``Claim.analyses``), computed when one does
ANALYSES = ("layer_sweep", "batch_invariance")
#: the needs an engine may lack (:attr:`EngineSpec.lacks`): the analyses, and per-layer K/V
CAPABILITIES = (*ANALYSES, "per_layer")
LACKABLE = frozenset(CAPABILITIES)


@dataclass(frozen=True)
class EngineSpec:
    """Everything kvaudit knows about one engine, in one record (compare pytest's plugins: one object per
    plugin, found by entry point)."""

    name: str
    #: opens one model at one precision: ``opener(OpenSpec) -> Backend``
    opener: Callable[[OpenSpec], Backend]
    #: ``forward``: the audit runs chunks of ids on a state it holds (transformers, llama.cpp); ``request``: the
    #: engine serves whole requests and keeps the state itself (vLLM), so its cells and calibration are its own
    level: Literal["forward", "request"] = "forward"
    #: registered schedules the engine builds by its own means (``Backend.construct``), run in every cell under
    #: it and priced by the plan; ``{batch}`` is filled with the run's batch size
    constructions: tuple[str, ...] = ()
    #: what it cannot do (:data:`LACKABLE`): never run, never priced; ``per_layer``: its state is read whole
    lacks: frozenset[str] = frozenset()
    #: the ``--kvaudit-dtypes`` values it runs (names of :mod:`pytest_kvaudit.core.model.precisions`)
    precisions: tuple[str, ...] = torch_precisions()
    #: builds one item's cells: ``cell_builder(dec, tokenizer, cfg, item_set, transplant, max_positions)`` with
    #: ``compute(item, dtype, fixed_prefix, grant)``; None: the forward-level builder (``core.compute.cells``)
    cell_builder: Callable[..., Any] | None = None
    #: times a few of its calls for the plan: ``calibrator(backend, items, prompts, item_set, cost) -> {...}``;
    #: None: the forward-level calibration (``core.planning.calibrate``)
    calibrator: Callable[..., dict[str, Any]] | None = None
    #: what reads its boundary states (fingerprint, compare, clone, transplant, check_supported, kinds,
    #: recurrent): a module or object; None: the layer adapters of ``core.runtime.state``
    state_reader: Any = None
    #: the report's lines about the engine, from the run's environment block; None: none
    report_lines: Callable[[Mapping[str, Any]], list[str]] | None = None

    def __post_init__(self) -> None:
        if not self.name or not callable(self.opener):
            raise KvauditError(f"engine {self.name!r}: an EngineSpec needs a name and an opener(OpenSpec) -> Backend")
        if self.level not in ("forward", "request"):
            raise KvauditError(f"engine {self.name!r}: level={self.level!r}; use 'forward' or 'request'")
        if self.level == "request" and (self.cell_builder is None or self.calibrator is None):
            raise KvauditError(f"engine {self.name!r} is request-level: give it its own cell_builder and calibrator "
                               "(the forward-level ones run chunks of ids on a state the engine does not hand out)")
        unknown = sorted(set(self.lacks) - LACKABLE)
        if unknown:
            raise KvauditError(f"engine {self.name!r}: lacks {', '.join(unknown)} is not one of "
                               f"{', '.join(sorted(LACKABLE))}")
        for p in self.precisions:
            named(p)

    def constructions_at(self, batch: int) -> tuple[str, ...]:
        """Its own constructions' names in a run of batch size ``batch`` (vLLM's ``batched(B)``)."""
        return tuple(n.format(batch=batch) for n in self.constructions)


_REGISTERED: dict[str, EngineSpec] = {}


def register_backend(spec: EngineSpec) -> EngineSpec:
    """Make ``--kvaudit-backend=spec.name`` run ``spec`` (replacing an entry point of that name); returns it."""
    if not isinstance(spec, EngineSpec):
        raise KvauditError(f"register_backend takes an EngineSpec, not {type(spec).__name__}: build one with "
                           "pytest_kvaudit.core.model.engines.EngineSpec(name, opener, ...)")
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


def engine(name: str) -> EngineSpec:
    """The record of engine ``name``, its entry point loaded the first time it is asked for."""
    if name not in _REGISTERED:
        ep = _entry_points().get(check(name))
        assert ep is not None
        spec = ep.load()
        if not isinstance(spec, EngineSpec) or spec.name != name:
            raise KvauditError(f"entry point {ep.value!r} ({GROUP} {name!r}) is not an EngineSpec named {name!r}: "
                               "point it at one")
        _REGISTERED[name] = spec
    return _REGISTERED[name]


def find(name: str | None) -> EngineSpec | None:
    """The record of ``name``, or None where this installation does not know it (a report from elsewhere)."""
    try:
        return engine(name) if name else None
    except KvauditError:
        return None


def lacks(name: str, what: str) -> bool:
    """Whether backend ``name`` cannot do ``what``: ``per_layer`` (its state is read whole, as bytes),
    ``layer_sweep``, ``batch_invariance``."""
    return what in engine(name).lacks


def backend_constructions(name: str) -> tuple[str, ...]:
    """The constructions backend ``name`` builds by its own means (an empty tuple for transformers)."""
    return engine(name).constructions
