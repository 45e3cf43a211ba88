"""Attention layers: full attention (dynamic and static layouts) and sliding-window attention.

A dynamic layer's K and V hold every position it keeps; a static layer's are preallocated to a maximum
length, of which only the first ``filled`` positions are the state (the rest are zeros the mask hides). A
sliding-window layer keeps only its window: the dynamic layout holds the last positions in order, the
static one shifts left once full (transformers' ``StaticSlidingWindowLayer``), so in both the held
positions are the first ``min(length, window)`` slots, in order.
"""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.core.runtime.state.protocol import Part

_COMMON = frozenset({"keys", "values", "is_initialized", "device", "dtype", "max_batch_size", "num_heads",
                     "k_head_dim", "v_head_dim", "head_dim"})


def held(layer: Any) -> int | None:
    """Positions a preallocated layer holds (None for a dynamic layer, whose tensors are all state)."""
    if getattr(layer, "max_cache_len", None) is None or getattr(layer, "keys", None) is None:
        return None
    if not getattr(layer, "is_initialized", True):
        return 0
    return min(int(layer.get_seq_length()), int(layer.keys.shape[-2]))


def kv_parts(layer: Any) -> list[Part]:
    k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
    if k is None or v is None or not getattr(layer, "is_initialized", True):
        return []
    n = held(layer)
    if n is not None:  # a view of the filled positions, no copy
        k, v = k[..., :n, :], v[..., :n, :]
    return [Part("k", "k", k), Part("v", "v", v)]


def write_kv(layer: Any, name: str, value: Any) -> None:
    attr = "keys" if name == "k" else "values"
    n = held(layer)
    if n is not None:  # keep the preallocated tensor: copy into its filled slice
        getattr(layer, attr)[..., :n, :].copy_(value.detach().to(getattr(layer, attr).device))
    else:
        setattr(layer, attr, value.detach().clone().to(getattr(layer, attr).device))


def kv_bytes_per_position(layer: Any) -> int:
    k = getattr(layer, "keys", None)
    if k is None or k.dim() < 2:
        return 0
    per = k.shape[:-2].numel() * k.shape[-1] * k.element_size()
    v = layer.values
    return int(per + v.shape[:-2].numel() * v.shape[-1] * v.element_size())


class FullAttention:
    """``DynamicLayer`` and ``StaticLayer``: K and V over every position so far."""

    attributes: frozenset[str] = _COMMON | {"max_cache_len", "cumulative_length"}

    def describe(self, layer: Any) -> str:
        return "full"

    def parts(self, layer: Any) -> list[Part]:
        return kv_parts(layer)

    def counters(self, layer: Any) -> dict[str, Any]:
        n = held(layer)
        return {} if n is None else {"length": n}

    def write(self, layer: Any, name: str, value: Any) -> None:
        write_kv(layer, name, value)

    def bytes_per_position(self, layer: Any) -> int:
        return kv_bytes_per_position(layer)


class SlidingWindow:
    """``DynamicSlidingWindowLayer`` and ``StaticSlidingWindowLayer``: K and V over the window it keeps."""

    attributes: frozenset[str] = _COMMON | {"max_cache_len", "cumulative_length", "cumulative_length_int",
                                                      "sliding_window", "_is_croppable", "_sliding_window_tensor",
                                                      "record_past"}

    def describe(self, layer: Any) -> str:
        window = getattr(layer, "sliding_window", None) or getattr(layer, "max_cache_len", None)
        return f"sliding({window})"

    def parts(self, layer: Any) -> list[Part]:
        return kv_parts(layer)

    def counters(self, layer: Any) -> dict[str, Any]:
        # how many tokens the layer has seen (its window holds the last of them)
        seen = getattr(layer, "cumulative_length_int", None)
        if seen is None:
            seen = getattr(layer, "cumulative_length", 0)
        return {"seen": int(seen or 0)}

    def write(self, layer: Any, name: str, value: Any) -> None:
        write_kv(layer, name, value)

    def bytes_per_position(self, layer: Any) -> int:
        return kv_bytes_per_position(layer)
