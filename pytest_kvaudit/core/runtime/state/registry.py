"""The adapter of each layer class (transformers' ``cache_utils`` classes), found through the class's MRO so
that a subclass resolves to its base's adapter, unless it carries a tensor the adapter does not know: then
the layer is refused in one line naming its class and the attribute, never half-audited."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.runtime.state.attention import FullAttention, SlidingWindow
from pytest_kvaudit.core.runtime.state.protocol import LayerKind, Part
from pytest_kvaudit.core.runtime.state.recurrent import Recurrent


class Hybrid:
    """A layer that holds attention K/V and a recurrent state (``LinearAttentionAnd*AttentionLayer``)."""

    def __init__(self, attention: Any) -> None:
        self.attention, self.recurrent = attention, Recurrent()
        self.attributes = attention.attributes | Recurrent.attributes

    def describe(self, layer: Any) -> str:
        return f"{self.attention.describe(layer)}+recurrent"

    def parts(self, layer: Any) -> list[Part]:
        return [*self.attention.parts(layer), *self.recurrent.parts(layer)]

    def counters(self, layer: Any) -> dict[str, Any]:
        return {**self.attention.counters(layer), **self.recurrent.counters(layer)}

    def write(self, layer: Any, name: str, value: Any) -> None:
        (self.attention if name in ("k", "v") else self.recurrent).write(layer, name, value)

    def bytes_per_position(self, layer: Any) -> int:
        return int(self.attention.bytes_per_position(layer))


FULL_HYBRID, SLIDING_HYBRID = Hybrid(FullAttention()), Hybrid(SlidingWindow())


#: class name (transformers' cache_utils) -> adapter; a name keeps the registry importable without torch
ADAPTERS: dict[str, LayerKind] = {
    "DynamicLayer": FullAttention(),
    "StaticLayer": FullAttention(),
    "DynamicSlidingWindowLayer": SlidingWindow(),
    "StaticSlidingWindowLayer": SlidingWindow(),
    "LinearAttentionLayer": Recurrent(),
    "LinearAttentionAndFullAttentionLayer": FULL_HYBRID,
    "LinearAttentionAndStaticFullAttentionLayer": FULL_HYBRID,
    "LinearAttentionAndSlidingWindowAttentionLayer": SLIDING_HYBRID,
    "LinearAttentionAndStaticSlidingWindowAttentionLayer": SLIDING_HYBRID,
}


def register_layer_kind(class_name: str, adapter: LayerKind) -> None:
    """Teach kvaudit another layer class (a cache layer of your own, or a newer transformers one)."""
    ADAPTERS[class_name] = adapter


def _unknown_tensors(layer: Any, known: frozenset[str]) -> list[str]:
    import torch

    def holds_tensor(v: Any) -> bool:
        if isinstance(v, torch.Tensor):
            return True
        if isinstance(v, dict):
            return any(isinstance(x, torch.Tensor) for x in v.values())
        if isinstance(v, (list, tuple)):
            return any(isinstance(x, torch.Tensor) for x in v)
        return False

    return sorted(k for k, v in vars(layer).items() if k not in known and holds_tensor(v))


def adapter(layer: Any) -> LayerKind:
    """The adapter of ``layer``'s class (or of its nearest registered base)."""
    cls = type(layer)
    for base in cls.__mro__:
        a = ADAPTERS.get(base.__name__)
        if a is not None:
            extra = _unknown_tensors(layer, a.attributes)
            if extra:
                raise UnsupportedCacheError(
                    f"cache layer {cls.__name__} carries state kvaudit has no adapter for ({', '.join(extra)}): "
                    "register one with pytest_kvaudit.core.runtime.state.register_layer_kind")
            return a
    raise UnsupportedCacheError(f"cache layer {cls.__name__} is a kind of state kvaudit has no adapter for: register "
                                "one with pytest_kvaudit.core.runtime.state.register_layer_kind")
