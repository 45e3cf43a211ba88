"""One engine's record: everything kvaudit knows about it, in one frozen value (compare pytest's plugins: one
object per plugin, found by entry point). Its fields are the typed protocols of
:mod:`pytest_kvaudit.core.model.engine_protocol`, and a field left out is the forward-level part (the cell builder,
calibration, state reader and cache probes that run chunks of ids on a state the audit holds), filled in here, so
no call site has a default of its own."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pytest_kvaudit.core.compute import probes
from pytest_kvaudit.core.compute.cells import CellBuilder
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.engine_protocol import (
    Backend,
    CacheProbe,
    Calibrator,
    CellBuilderFactory,
    OpenSpec,
    RequestPrice,
    StateReader,
)
from pytest_kvaudit.core.model.engines import LACKABLE
from pytest_kvaudit.core.model.precisions import named, torch_precisions
from pytest_kvaudit.core.planning.calibrate import forward_calibration
from pytest_kvaudit.core.runtime import state

__all__ = ["EngineSpec"]


def no_check(cfg: Any) -> None:
    """A record's check of the run's config when it has none of its own."""


@dataclass(frozen=True)
class EngineSpec:
    """Everything kvaudit knows about one engine (``--kvaudit-backend=NAME``), found by entry point."""

    name: str
    #: opens one model at one precision: ``opener(OpenSpec) -> Backend``
    opener: Callable[[OpenSpec], Backend]
    #: ``forward``: the audit runs chunks of ids on a state it holds (transformers, llama.cpp); ``request``: the
    #: engine serves whole requests and keeps the state itself (vLLM), so its cells and calibration are its own
    level: Literal["forward", "request"] = "forward"
    #: registered schedules the engine builds by its own means (``Backend.construct``), run in every cell under
    #: it and priced by the plan; ``{batch}`` is filled with the run's batch size
    constructions: tuple[str, ...] = ()
    #: what it cannot do (``LACKABLE``): never run, never priced; ``per_layer``: its state is read whole
    lacks: frozenset[str] = frozenset()
    #: the ``--kvaudit-dtypes`` values it runs (names of :mod:`pytest_kvaudit.core.model.precisions`)
    precisions: tuple[str, ...] = torch_precisions()
    #: builds one precision's cells: ``cell_builder(dec, tokenizer, cfg, item_set, transplant, max_positions)``
    #: with ``compute(item, dtype, fixed_prefix, grant)``
    cell_builder: CellBuilderFactory = CellBuilder
    #: times a few of its calls for the plan: ``calibrator(backend, items, prompts, item_set, cost) -> {...}``
    calibrator: Calibrator = forward_calibration
    #: what reads its boundary states (fingerprint, compare, transplant; a forward-level one also clones and
    #: names layer kinds): a module or an object
    state_reader: StateReader = state
    #: the report's lines about the engine, from the run's environment block; None: none
    report_lines: Callable[[Mapping[str, Any]], list[str]] | None = None
    #: a request-level engine's price of a step whose requests are not the pipeline's forwards (its prefix-cache
    #: hits, a batch's other requests, a transplant that prefills again): ``request_price(name, prompt, head,
    #: suffix, budget) -> (calls, tokens)``, or None for the step's declared price
    request_price: RequestPrice | None = None
    #: the price under the run's ``--kvaudit-engine-arg`` pairs, for an engine whose block or page size is a
    #: setting: ``request_price_for(engine_args) -> RequestPrice``; None: :attr:`request_price` whatever they are
    request_price_for: Callable[[tuple[tuple[str, str], ...]], RequestPrice | None] | None = None
    #: the ``--kvaudit-cache`` kinds beyond ``dynamic`` it runs (vLLM: ``("quantized:fp8",)``); None: every kind
    #: (the forward-level probes make each one); checked at configure
    cache_kinds: tuple[str, ...] | None = None
    #: runs one further cache kind on one precision's records: ``cache_probe(store, backend, dtype, kind)``
    cache_probe: CacheProbe = probes.cache_probe
    #: what :attr:`cache_kinds` are in the engine's own words, for the one line that refuses another kind
    cache_kinds_said: str = ""
    #: the ``--kvaudit-engine-arg`` keys it takes: none by default (a run that gives one is refused in one line);
    #: None: any key, which its :attr:`check_settings` checks (vLLM's against its own ``EngineArgs``)
    engine_arg_keys: frozenset[str] | None = frozenset()
    #: checks the run's config (its engine args, cache kinds, lengths) before anything computes: raises one
    #: ``KvauditError`` line naming the setting and why; called once, at configure
    check_settings: Callable[[Any], None] = no_check

    def __post_init__(self) -> None:
        if not self.name or not callable(self.opener):
            raise KvauditError(f"engine {self.name!r}: an EngineSpec needs a name and an opener(OpenSpec) -> Backend")
        if self.level not in ("forward", "request"):
            raise KvauditError(f"engine {self.name!r}: level={self.level!r}; use 'forward' or 'request'")
        if self.level == "request" and (self.cell_builder is CellBuilder or self.calibrator is forward_calibration):
            raise KvauditError(f"engine {self.name!r} is request-level: give it its own cell_builder and calibrator "
                               "(the forward-level ones run chunks of ids on a state the engine does not hand out)")
        unknown = sorted(set(self.lacks) - LACKABLE)
        if unknown:
            raise KvauditError(f"engine {self.name!r}: lacks {', '.join(unknown)} is not one of "
                               f"{', '.join(sorted(LACKABLE))}")
        for p in self.precisions:
            named(p)

    def price_under(self, engine_args: tuple[tuple[str, str], ...]) -> RequestPrice | None:
        """The plan's price of its requests under the run's ``--kvaudit-engine-arg`` pairs (vLLM's ``block_size``,
        transformers-cb's ``page_size`` decide which ids a hit shares)."""
        return self.request_price if self.request_price_for is None else self.request_price_for(engine_args)

    def constructions_at(self, batch: int) -> tuple[str, ...]:
        """Its own constructions' names in a run of batch size ``batch`` (vLLM's ``batched(B)``)."""
        return tuple(n.format(batch=batch) for n in self.constructions)

    def check_cache_kinds(self, kinds: tuple[str, ...]) -> tuple[str, ...]:
        """``kinds`` (``--kvaudit-cache``, beyond ``dynamic``) if it runs each of them, else one line naming the
        first it does not run, the engine and what it runs."""
        if self.cache_kinds is None:
            return kinds
        for kind in kinds:
            if kind not in self.cache_kinds:
                runs = ", ".join(self.cache_kinds) or "no kind beyond dynamic"
                said = f" ({self.cache_kinds_said})" if self.cache_kinds_said else ""
                raise KvauditError(f"--kvaudit-cache={kind}: the {self.name} backend runs {runs}{said}")
        return kinds

    def check_engine_args(self, pairs: tuple[tuple[str, str], ...], flag: str) -> tuple[tuple[str, str], ...]:
        """``pairs`` (``--kvaudit-engine-arg``) if it takes each key, else one line naming the first it does not
        take and what it takes (``flag`` names where they came from)."""
        if self.engine_arg_keys is None:
            return pairs
        for key, _ in pairs:
            if key not in self.engine_arg_keys:
                takes = ", ".join(sorted(self.engine_arg_keys)) or "none"
                raise KvauditError(f"{flag} {key}: the {self.name} backend takes no such setting (it takes: {takes})")
        return pairs
