"""The one adapter over transformers' Cache: layer tensors, clone, equality, fingerprint, transplant.

transformers moved the K/V tensors into ``cache.layers[i].keys/.values`` (4.56) and renamed the
forward argument ``past_key_values`` to ``cache`` (5.x). Every other module goes through here, so API
drift is mended in one place.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kvaudit.engine.errors import UnsupportedCacheError

_CACHE_KWARG: dict[type, str] = {}


def cache_kwarg(model: Any) -> str:
    """The name the model's forward takes its cache under (``cache`` in 5.x, ``past_key_values`` before)."""
    cls = type(model)
    if cls not in _CACHE_KWARG:
        params = inspect.signature(cls.forward).parameters
        _CACHE_KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARG[cls]


#: the cache layouts kvaudit audits: ``dynamic`` (grows per token) and ``static`` (preallocated to a maximum
#: length, what users pair with ``torch.compile``)
CACHE_KINDS = ("dynamic", "static")


def new_cache(model: Any, kind: str = "dynamic", max_cache_len: int | None = None) -> Any:
    """A fresh cache of ``kind``; a static one is preallocated to ``max_cache_len`` positions."""
    if kind == "static":
        from transformers import StaticCache

        if max_cache_len is None:
            raise UnsupportedCacheError("a static cache needs max_cache_len")
        try:
            return StaticCache(config=model.config, max_cache_len=max_cache_len)
        except TypeError:  # 4.57 takes max_batch_size too
            return StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_cache_len)
    if kind != "dynamic":
        raise UnsupportedCacheError(f"unknown cache kind {kind!r}: use {' or '.join(CACHE_KINDS)}")
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signature
        return DynamicCache()


def filled(layer: Any) -> int | None:
    """How many positions a preallocated (static) layer holds; None for a layer whose tensors are all filled.

    A static layer's ``keys``/``values`` span ``max_cache_len`` positions, of which the first ``filled``
    are written: only those are the state (the rest are zeros that the attention mask hides)."""
    if getattr(layer, "max_cache_len", None) is None or getattr(layer, "keys", None) is None:
        return None
    if not getattr(layer, "is_initialized", True):
        return 0
    n = int(layer.get_seq_length())
    if getattr(layer, "is_sliding", False) and n > layer.keys.shape[-2]:
        raise UnsupportedCacheError(
            f"a static sliding-window layer holding {n} positions in a window of {layer.keys.shape[-2]} rolls over: "
            "its positions are not in order"
        )
    return n


def _layers(cache: Any) -> list[Any]:
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise UnsupportedCacheError(
            f"{type(cache).__name__} has no per-layer K/V (cache.layers): kvaudit needs transformers >= 4.57"
        )
    return list(layers)


def check_plain_kv(cache: Any) -> None:
    """Refuse caches that carry state beyond K/V: a transplant of K/V alone would not be the whole state."""
    for i, layer in enumerate(_layers(cache)):
        extra = [a for a in ("conv_states", "recurrent_states", "ssm_states") if getattr(layer, a, None) is not None]
        if extra or not hasattr(layer, "keys"):
            what = ", ".join(extra) or type(layer).__name__
            raise UnsupportedCacheError(f"layer {i} of the cache holds state beyond K/V ({what}): K/V transplant and bridge do not apply")


def layer_kv(cache: Any) -> list[tuple[Any, Any]]:
    """``[(K, V), ...]`` one pair per layer, the tensors themselves (no copy)."""
    out = []
    for i, layer in enumerate(_layers(cache)):
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if k is None or v is None or (hasattr(k, "numel") and k.numel() == 0):
            raise UnsupportedCacheError(f"layer {i} of the cache holds no K/V tensors (uninitialised or not attention)")
        n = filled(layer)
        if n is not None:  # a static layer: the filled positions only (a view, no copy)
            if n == 0:
                raise UnsupportedCacheError(f"layer {i} of the cache holds no K/V tensors (uninitialised or not attention)")
            k, v = k[..., :n, :], v[..., :n, :]
        out.append((k, v))
    return out


def clone(cache: Any) -> Any:
    """A deep copy that shares no storage with ``cache``."""
    return copy.deepcopy(cache)


def tensor_bytes(t: Any) -> memoryview:
    """The raw bytes of a tensor, on the host, without a dtype round trip."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def digest(tag: bytes = b"") -> Any:
    """The fingerprint hash: XXH3-128 (xxhash), tens of GB/s, so fingerprints cost about a memory copy.
    It is not cryptographic: it detects any change of the bytes, it does not resist a forger."""
    import xxhash

    h = xxhash.xxh3_128()
    h.update(tag)
    return h


def fingerprint_tensors(tensors: Iterable[Any], tag: bytes = b"") -> str:
    """XXH3-128 over dtype, shape and raw bytes of each tensor: equal digest <=> bit-identical."""
    h = digest(tag)
    for t in tensors:
        h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(tensor_bytes(t))
    return h.hexdigest()


def state_tensors(cache: Any) -> list[Any]:
    """Every tensor a cache holds, layer by layer in attribute-name order: the whole decoder state,
    also for layers that carry more than K/V (convolution or recurrent states)."""
    import torch

    out: list[Any] = []

    def walk(val: Any) -> None:
        if isinstance(val, torch.Tensor):
            out.append(val)
        elif isinstance(val, dict):
            for k in sorted(val, key=str):
                walk(val[k])
        elif isinstance(val, (list, tuple)):
            for v in val:
                walk(v)

    for layer in _layers(cache):
        for _, val in sorted(vars(layer).items()):
            walk(val)
    return out


def is_plain_kv(cache: Any) -> bool:
    try:
        check_plain_kv(cache)
        layer_kv(cache)
    except UnsupportedCacheError:
        return False
    return True


def fingerprint(cache: Any, layers: Sequence[int] | None = None, parts: str = "kv") -> str:
    """Digest of the K/V bytes (all layers, or ``layers``; K and/or V); for a cache that holds more
    than K/V, of every tensor it holds."""
    if layers is None and parts == "kv" and not is_plain_kv(cache):
        return fingerprint_tensors(state_tensors(cache), tag=b"state")
    kv = layer_kv(cache)
    idx = range(len(kv)) if layers is None else layers
    ts = []
    for i in idx:
        if "k" in parts:
            ts.append(kv[i][0])
        if "v" in parts:
            ts.append(kv[i][1])
    return fingerprint_tensors(ts, tag=parts.encode())


def fingerprint_ids(ids: Sequence[int]) -> str:
    h = digest(b"ids")
    h.update(",".join(str(int(i)) for i in ids).encode())
    return h.hexdigest()


@dataclass(frozen=True)
class LayerComparison:
    layer: int
    keys_equal: bool
    values_equal: bool
    keys_max_abs: float
    values_max_abs: float
    keys_rel: float
    values_rel: float


def _diff(a: Any, b: Any) -> tuple[bool, float, float]:
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return False, float("inf"), float("inf")
    b = b.to(a.device)  # layers of a device-mapped model live on different devices
    eq = bool(torch.equal(a, b))
    if eq:
        return True, 0.0, 0.0
    d = (a.float() - b.float()).abs()
    mx = float(d.max())
    scale = float(b.float().abs().max()) or 1.0
    return False, mx, mx / scale


def compare(a: Any, b: Any) -> list[LayerComparison]:
    """Per layer: are K and V bit-identical (``torch.equal``), and how far apart when not."""
    ka, kb = layer_kv(a), layer_kv(b)
    if len(ka) != len(kb):
        raise UnsupportedCacheError(f"caches have {len(ka)} and {len(kb)} layers: they come from different models")
    out = []
    for i, ((k1, v1), (k2, v2)) in enumerate(zip(ka, kb)):
        ke, km, kr = _diff(k1, k2)
        ve, vm, vr = _diff(v1, v2)
        out.append(LayerComparison(i, ke, ve, km, vm, kr, vr))
    return out


def equal(a: Any, b: Any) -> bool:
    return all(c.keys_equal and c.values_equal for c in compare(a, b))


def transplant(receiver: Any, donor: Any, layers: Sequence[int] | None = None, parts: str = "kv") -> Any:
    """A new cache: ``receiver`` with ``donor``'s K and/or V copied into ``layers`` (all by default).

    Neither input is modified. The two caches must cover the same positions. Either may be static: a static
    receiver keeps its preallocated tensors (their addresses are what ``torch.compile`` relies on) and gets
    the donor's filled positions copied into its own filled slice.
    """
    out = clone(receiver)
    dst, src, mine = _layers(out), layer_kv(donor), layer_kv(out)
    if len(dst) != len(src):
        raise UnsupportedCacheError(f"donor has {len(src)} layers, receiver {len(dst)}: not the same model")
    for i in range(len(src)) if layers is None else layers:
        k, v = src[i]
        if mine[i][0].shape != k.shape:
            raise UnsupportedCacheError(
                f"layer {i}: donor K/V shape {tuple(k.shape)} differs from the receiver's {tuple(mine[i][0].shape)}"
            )
        static = filled(dst[i]) is not None
        if "k" in parts:
            if static:
                mine[i][0].copy_(k.detach().to(mine[i][0].device))
            else:
                dst[i].keys = k.detach().clone().to(dst[i].keys.device)
        if "v" in parts:
            if static:
                mine[i][1].copy_(v.detach().to(mine[i][1].device))
            else:
                dst[i].values = v.detach().clone().to(dst[i].values.device)
    return out
