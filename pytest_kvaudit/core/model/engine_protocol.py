"""What the audit needs of a model engine, as a ``Protocol`` (compare pytest-xdist's ``scheduler/protocol.py``).

A backend is one model loaded at one precision with its identity. The decoder
(:mod:`pytest_kvaudit.core.runtime.decoder`) counts every forward and applies the fault hooks around these calls, so a
backend only runs them; the state it hands out is whatever the engine keeps between forwards (transformers' ``Cache``),
and the state adapters (:mod:`pytest_kvaudit.core.runtime.state`) are what read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class OpenSpec:
    """What opening a model takes, as one value: the seven settings used to travel as loose positional
    arguments through four calls (store -> engine registry -> engine -> loader), and each new setting meant
    editing all four. ``engine_args`` are an engine's own settings, passed through untouched (empty by default)."""

    model: str
    dtype: str
    device: str = "auto"
    attn: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    device_map: str | None = None
    engine_args: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class Backend(Protocol):
    """One model at one precision on one device."""

    #: checkpoint identity: id, architecture, num_layers, weights_digest (what a ledger is keyed on)
    identity: dict[str, Any]
    dtype: str
    device: str
    attn_implementation: str
    tokenizer: Any
    eos_ids: frozenset[int]
    vocab_size: int
    #: prompt + generation longer than this is ineligible (too_long); None when the model has no limit
    max_positions: int | None

    def encode(self, text: str) -> list[int]:
        """Text -> ids, with the tokenizer's special tokens (a prompt)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, special tokens kept (for labels and people; never re-encoded)."""

    def fresh(self, kind: str = "dynamic", max_len: int | None = None) -> Any:
        """An empty state of layout ``kind`` (a static one preallocated to ``max_len`` positions)."""

    def step(self, ids: Sequence[int], state: Any) -> Any:
        """Feed one chunk of ``ids`` on top of ``state`` (mutated); the next-token logits, shape ``[vocab]``."""

    def step_batch(self, rows: Sequence[Sequence[int]], pad: int) -> Any:
        """A fresh state over ``rows`` left-padded with ``pad`` into one batch, in one forward."""

    def shape(self) -> dict[str, int]:
        """layers, kv_heads, head_dim, parameters, and whether any layer carries recurrent state."""


# -- the parts of an engine's record (:class:`pytest_kvaudit.core.engine.record.EngineSpec`), as protocols: the
# core calls them through these, whatever engine fills them (items, records and the store are ``Any`` here: this
# module sits below them)


class CellBuilding(Protocol):
    """One precision's cell builder, as the store drives it (:class:`pytest_kvaudit.core.compute.cells.CellBuilder`
    is the forward-level one)."""

    #: each layer's kind (full, sliding(W), recurrent...), once the first boundary state is read
    layer_kinds: list[str] | None

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text (the stop rule reads it)."""

    def compute(self, item: Any, dtype: str, fixed_prefix: tuple[int, ...] | None,
                grant: Callable[[], tuple[bool, ...]]) -> tuple[Any, tuple[int, ...] | None]:
        """The cell of ``item`` at ``dtype`` (a ``CellRecord``) and its prefix (None when ineligible)."""


class CellBuilderFactory(Protocol):
    """Builds one precision's :class:`CellBuilding` (a class, usually)."""

    def __call__(self, dec: Any, tokenizer: Any, cfg: Any, item_set: Any,
                 transplant: Callable[[Any, Any, Any, str], Any] | None = None,
                 max_positions: int | None = None) -> CellBuilding: ...


class Calibrator(Protocol):
    """Times a few of an engine's calls for ``--kvaudit-plan``: ``per_call_s``, ``per_token_s``, ``items``..."""

    def __call__(self, backend: Any, items: Sequence[Any], prompts: Sequence[Sequence[int]], item_set: Any,
                 cost: Any, /) -> dict[str, Any]: ...


class StateReader(Protocol):
    """What every engine's boundary state is read through: a module or an object (the forward-level one is
    :mod:`pytest_kvaudit.core.runtime.state`, which also clones and names layer kinds: :class:`LayerStateReader`)."""

    def fingerprint(self, state: Any, /) -> str:
        """The state's digest: two states are equal iff their fingerprints are."""

    def compare(self, a: Any, b: Any, /) -> list[Any]:
        """Per layer, how ``a`` and ``b`` differ (``LayerComparison``)."""

    def transplant(self, receiver: Any, donor: Any, layers: Sequence[int] | None = None, parts: str = "kv",
                   /) -> Any:
        """``receiver`` with ``donor``'s K/V in ``layers`` (None: all)."""


class LayerStateReader(StateReader, Protocol):
    """A forward-level engine's state reader: a state the audit holds, cloned, checked and read layer by layer."""

    def clone(self, state: Any, /) -> Any: ...
    def check_supported(self, state: Any, /) -> None: ...
    def kinds(self, state: Any, /) -> list[str]: ...
    def recurrent(self, state: Any, /) -> bool: ...
    def layers_of(self, state: Any, /) -> list[Any]: ...


class CacheProbe(Protocol):
    """Runs one further ``--kvaudit-cache`` kind on one precision's records (writing ``probes.cache[kind]``)."""

    def __call__(self, store: Any, backend: Any, dtype: str, kind: str, /) -> None: ...


#: a request-level engine's price of a step that is not the pipeline's forwards: ``(name, prompt, head, suffix,
#: budget) -> (calls, tokens)``, or None for the step's declared price
RequestPrice = Callable[[str, int, int, int, int], "tuple[int, int] | None"]


@runtime_checkable
class Engine(Protocol):
    """What the core reads of an engine's record, whatever class holds it (the built-in records are
    :class:`pytest_kvaudit.core.engine.record.EngineSpec`): a run's config carries it
    (:attr:`pytest_kvaudit.core.model.config.AuditConfig.engine`), resolved from its name once."""

    @property
    def name(self) -> str: ...
    @property
    def opener(self) -> Callable[[OpenSpec], Backend]: ...
    @property
    def level(self) -> str: ...
    @property
    def constructions(self) -> tuple[str, ...]: ...
    @property
    def lacks(self) -> frozenset[str]: ...
    @property
    def precisions(self) -> tuple[str, ...]: ...
    @property
    def cell_builder(self) -> CellBuilderFactory: ...
    @property
    def calibrator(self) -> Calibrator: ...
    @property
    def state_reader(self) -> StateReader: ...
    @property
    def cache_probe(self) -> CacheProbe: ...
    @property
    def request_price(self) -> RequestPrice | None: ...
    def price_under(self, engine_args: tuple[tuple[str, str], ...]) -> RequestPrice | None: ...
    @property
    def report_lines(self) -> Callable[[Mapping[str, Any]], list[str]] | None: ...

    @property
    def engine_arg_keys(self) -> frozenset[str] | None: ...
    @property
    def check_settings(self) -> Callable[[Any], None]: ...

    def constructions_at(self, batch: int) -> tuple[str, ...]: ...
    def check_cache_kinds(self, kinds: tuple[str, ...]) -> tuple[str, ...]: ...
    def check_engine_args(self, pairs: tuple[tuple[str, str], ...], flag: str) -> tuple[tuple[str, str], ...]: ...
