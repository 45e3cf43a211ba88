"""A boundary state that an engine keeps whole and hands out only as bytes (llama.cpp's sequence state).

transformers exposes every layer's K and V as tensors; an engine such as llama.cpp keeps its KV cache inside
its own context and lets a caller read it only as one serialised blob (``llama_state_seq_get_data``) and load
a blob back (``llama_state_set_data``). What the audit can honestly do with such a state is what this module
does: fingerprint the bytes, compare two states byte for byte (naming the first differing byte), clone one
into another context, and transplant the donor's state *whole*. Per-layer comparison, per-layer or K-only /
V-only transplants and the layer sweep are refused with the backend's name (:data:`NOT_AVAILABLE`), never
approximated. :mod:`pytest_kvaudit.core.runtime.state` dispatches here for any :class:`WholeState`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.runtime.state.protocol import LayerComparison, PartDiff
from pytest_kvaudit.core.runtime.state.tensors import digest

#: what a whole-state backend cannot do, as the report names it
NOT_AVAILABLE = ("per-layer comparison", "per-layer transplants", "K-only/V-only transplants", "layer sweep",
                 "batch invariance")


class WholeState(ABC):
    """An engine's state over some positions, readable only as bytes."""

    #: the engine's name, in refusals and in the report (``llama.cpp``)
    backend: str = "engine"

    @abstractmethod
    def state_bytes(self) -> bytes:
        """The bytes the fingerprint and the comparison read: the KV cache only (no logits, no RNG)."""

    @abstractmethod
    def clone(self) -> WholeState:
        """A copy in another context of the engine's own, sharing nothing with this one."""

    @abstractmethod
    def load(self, donor: WholeState) -> None:
        """Replace this state with ``donor``'s, whole, through the engine's own save/load path."""

    @property
    def kind(self) -> str:
        """The single "layer" the report shows for a state it cannot open."""
        return f"whole({self.backend})"

    def refuse(self, what: str) -> UnsupportedCacheError:
        return UnsupportedCacheError(f"the {self.backend} backend keeps its state whole: {what} is not available")


def fingerprint(state: WholeState, layers: Sequence[int] | None = None, parts: str = "kv") -> str:
    """Digest of the state's bytes; only the whole state has one."""
    if layers is not None or parts != "kv":
        raise state.refuse(f"a fingerprint of layers {layers} part {parts!r}")
    return str(digest(b"whole|" + state.backend.encode() + b"|" + state.state_bytes()).hexdigest())


def first_difference(a: bytes, b: bytes) -> int | None:
    """The first byte offset where ``a`` and ``b`` differ (their common length when one is a prefix of the other)."""
    if a == b:
        return None
    n = min(len(a), len(b))
    lo, hi = 0, n  # bisect on equal prefixes: the blobs are megabytes, a byte loop in Python is slow
    while lo < hi:
        mid = (lo + hi) // 2
        if a[lo:mid + 1] == b[lo:mid + 1]:
            lo = mid + 1
        else:
            hi = mid
    return lo


def compare(a: WholeState, b: WholeState) -> list[LayerComparison]:
    """One row for the whole state: bytes equal or not, and the first differing byte. The row's K and V columns
    both show the whole state's verdict (there is no K or V to tell apart); no magnitude is claimed."""
    x, y = a.state_bytes(), b.state_bytes()
    same = x == y
    first = first_difference(x, y)
    gap = 0.0 if same else float("nan")
    parts = tuple(PartDiff("state", side, same, gap, gap, first) for side in ("k", "v"))
    return [LayerComparison(0, a.kind, parts)]


def transplant(receiver: WholeState, donor: WholeState, layers: Sequence[int] | None = None, parts: str = "kv") -> Any:
    """A new state: a clone of ``receiver`` with ``donor``'s state loaded into it whole. Only the whole state can
    move (``layers`` None, or the one row :func:`compare` reports)."""
    if (layers is not None and list(layers) != [0]) or parts != "kv":
        raise receiver.refuse(f"a transplant of layers {layers} part {parts!r}")
    out = receiver.clone()
    out.load(donor)
    return out
