"""The adapter of each layer class (transformers' ``cache_utils`` classes), found through the class's MRO so
that a subclass resolves to its base's adapter, unless it carries a tensor the adapter does not know: then
the layer is refused in one line naming its class and the attribute, never half-audited."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.engine.errors import UnsupportedCacheError
from pytest_kvaudit.engine.state.attention import FullAttention, SlidingWindow
from pytest_kvaudit.engine.state.protocol import LayerKind
from pytest_kvaudit.engine.state.recurrent import FULL_HYBRID, SLIDING_HYBRID, Recurrent

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
                    "register one with pytest_kvaudit.engine.state.register_layer_kind")
            return a
    raise UnsupportedCacheError(f"cache layer {cls.__name__} is a kind of state kvaudit has no adapter for: register "
                                "one with pytest_kvaudit.engine.state.register_layer_kind")
