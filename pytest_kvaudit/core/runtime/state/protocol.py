"""What kvaudit needs of one kind of layer state: its tensors, its length, its counters, and how to write a
donor's tensor into it. One adapter per kind, after transformers' own unit (the layer classes of
``cache_utils.py``); :mod:`.registry` finds the adapter of a layer by its class.

Everything else (fingerprints, per-layer comparison, clone, transplant, the bridge's equality) is built on
these few operations in :mod:`pytest_kvaudit.core.runtime.state`, the same way for every kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class Part:
    """One tensor of a layer's state. ``side`` puts it in the K or the V column of the report's per-layer
    tables (a recurrent layer's conv state reads as K, its recurrent state as V); ``positional`` says the
    tensor has a position axis (-2), as K and V do."""

    name: str
    side: str
    tensor: Any = field(repr=False)
    attention: bool = True
    positional: bool = True


class LayerKind(Protocol):
    """One kind of layer state."""

    #: attributes of the layer this kind accounts for; any other tensor an instance carries is state
    #: kvaudit does not know, and the layer is refused rather than half-audited
    attributes: frozenset[str]

    def describe(self, layer: Any) -> str:
        """The kind as the report names it: ``full``, ``sliding(W)``, ``recurrent``, ``full+recurrent``."""

    def parts(self, layer: Any) -> list[Part]:
        """The tensors that make up the state now (a static layer's filled positions only)."""

    def counters(self, layer: Any) -> dict[str, Any]:
        """Counters and flags, compared as values (never hashed as bytes)."""

    def write(self, layer: Any, name: str, value: Any) -> None:
        """Put ``value`` (a donor's part of the same shape) into the layer's part ``name``: replaced on a
        dynamic layer, copied in place into a preallocated one (``torch.compile`` relies on its address)."""

    def bytes_per_position(self, layer: Any) -> int:
        """State bytes one more position adds (0 for a recurrent state, whose size is fixed)."""


@dataclass(frozen=True)
class PartDiff:
    """One part of one layer set against the same part of another state."""

    name: str
    side: str
    equal: bool
    max_abs: float
    rel: float
    #: first differing position (K/V: along the positions held; a recurrent state: the flat element index)
    first: int | None = None
    max_ulps: int | None = None


@dataclass(frozen=True)
class LayerComparison:
    """A layer of two states compared: per part, and as the K and V columns the report shows."""

    layer: int
    kind: str
    parts: tuple[PartDiff, ...]
    counters_equal: bool = True

    def _side(self, side: str) -> list[PartDiff]:
        return [p for p in self.parts if p.side == side]

    @property
    def keys_equal(self) -> bool:
        return self.counters_equal and all(p.equal for p in self._side("k"))

    @property
    def values_equal(self) -> bool:
        return self.counters_equal and all(p.equal for p in self._side("v"))

    @property
    def keys_max_abs(self) -> float:
        return max((p.max_abs for p in self._side("k")), default=0.0)

    @property
    def values_max_abs(self) -> float:
        return max((p.max_abs for p in self._side("v")), default=0.0)

    @property
    def keys_rel(self) -> float:
        return max((p.rel for p in self._side("k")), default=0.0)

    @property
    def values_rel(self) -> float:
        return max((p.rel for p in self._side("v")), default=0.0)

    @property
    def equal(self) -> bool:
        return self.keys_equal and self.values_equal
