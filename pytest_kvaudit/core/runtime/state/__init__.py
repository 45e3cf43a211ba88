"""The boundary state, whatever the layers carry: fingerprints, per-layer comparison, clone and transplant,
built on one adapter per kind of layer state (:mod:`.attention`, :mod:`.recurrent`, found by
:mod:`.registry`). Every other engine module reaches a cache through here, so transformers' API drift and
a new kind of state are mended in one place.

``parts`` selects what a fingerprint or a transplant covers: ``kv`` the whole state of each layer (K and V,
and a recurrent layer's conv and recurrent states), ``k`` / ``v`` one column (a recurrent layer's conv state
is its K column, its recurrent state its V column), ``attn`` the attention K/V only (on a hybrid: does K/V
alone carry the divergence?).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.model.cache_kinds import OFFLOADED, QUANTIZED, is_lossy
from pytest_kvaudit.core.model.digests import digest, fingerprint_ids
from pytest_kvaudit.core.runtime.state import lossy, whole
from pytest_kvaudit.core.runtime.state.forward_kwarg import cache_kwarg
from pytest_kvaudit.core.runtime.state.protocol import LayerComparison, LayerKind, Part, PartDiff
from pytest_kvaudit.core.runtime.state.registry import adapter, register_layer_kind
from pytest_kvaudit.core.runtime.state.tensors import (
    add_tensor,
    fingerprint_tensors,
    first_position,
    tensor_bytes,
    ulps,
)

__all__ = ["CACHE_KINDS", "LINEAR_LAYER", "LayerComparison", "LayerKind", "Part", "PartDiff", "cache_kwarg",
           "check_supported", "clone", "compare", "digest", "equal", "fingerprint", "fingerprint_ids",
           "fingerprint_tensors", "kinds", "lossy", "layer_kv", "layers_of", "new_cache", "recurrent",
           "register_layer_kind", "row_state", "tensor_bytes", "transplant"]

#: what transformers' layer classes that carry a recurrent state have in their names
LINEAR_LAYER = "LinearAttention"


def _dynamic(model: Any, max_cache_len: int | None) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older signature
        return DynamicCache()


def _static(model: Any, max_cache_len: int | None) -> Any:
    from transformers import StaticCache

    if max_cache_len is None:
        raise UnsupportedCacheError("a static cache needs max_cache_len")
    try:
        return StaticCache(config=model.config, max_cache_len=max_cache_len)
    except TypeError:  # 4.57 takes max_batch_size too
        return StaticCache(config=model.config, max_batch_size=1, max_cache_len=max_cache_len)


#: the cache layouts kvaudit audits -> how to make a fresh one: ``dynamic`` (grows per token), ``static``
#: (preallocated to a maximum length, what users pair with ``torch.compile``), ``offloaded`` (a dynamic cache
#: parked on the CPU between forwards, CUDA only) and ``quantized:BACKEND-intN`` (lossy: :mod:`.lossy`)
CACHE_KINDS = {"dynamic": _dynamic, "static": _static, OFFLOADED: lambda model, _: lossy.offloaded(model),
               QUANTIZED: None}


def new_cache(model: Any, kind: str = "dynamic", max_cache_len: int | None = None) -> Any:
    """A fresh cache of ``kind``; a static one is preallocated to ``max_cache_len`` positions."""
    if is_lossy(kind):
        return lossy.quantized(model, kind)
    make = CACHE_KINDS.get(kind)
    if make is None:
        raise UnsupportedCacheError(f"unknown cache kind {kind!r}: use {' or '.join(CACHE_KINDS)}")
    return make(model, max_cache_len)


def layers_of(cache: Any) -> list[Any]:
    if isinstance(cache, whole.WholeState):
        raise cache.refuse("per-layer access")
    layers = getattr(cache, "layers", None)
    if layers is None:
        raise UnsupportedCacheError(
            f"{type(cache).__name__} has no per-layer state (cache.layers): kvaudit needs transformers >= 4.57")
    return list(layers)


def layer_kv(cache: Any) -> list[tuple[Any, Any]]:
    """``[(K, V), ...]`` one pair per layer, the tensors themselves (no copy; a static layer's filled view), for
    caches of attention layers (fault hooks and tests reach into them this way)."""
    out = []
    for i, layer in enumerate(layers_of(cache)):
        kv = {p.name: p.tensor for p in adapter(layer).parts(layer) if p.attention}
        if "k" not in kv:
            raise UnsupportedCacheError(f"layer {i} of the cache ({type(layer).__name__}) holds no attention K/V")
        out.append((kv["k"], kv["v"]))
    return out


def _selected(p: Part, parts: str) -> bool:
    if parts == "kv":
        return True
    if parts == "attn":
        return p.attention
    if parts == "recurrent":
        return not p.attention
    return p.side in parts


def check_supported(cache: Any) -> None:
    """Every layer has an adapter and holds some state (a one-line refusal naming the layer's class if not)."""
    if isinstance(cache, whole.WholeState):
        return
    for i, layer in enumerate(layers_of(cache)):
        if not adapter(layer).parts(layer):
            raise UnsupportedCacheError(f"layer {i} of the cache ({type(layer).__name__}) holds no state yet")


def kinds(cache: Any) -> list[str]:
    """Each layer's kind as the report names it (``full``, ``sliding(8)``, ``recurrent``, ``full+recurrent``)."""
    if isinstance(cache, whole.WholeState):
        return [cache.kind]
    return [adapter(layer).describe(layer) for layer in layers_of(cache)]


def recurrent(cache: Any) -> bool:
    """Whether any layer carries state beyond attention K/V."""
    if isinstance(cache, whole.WholeState):
        return False
    return any(not p.attention for layer in layers_of(cache) for p in adapter(layer).parts(layer))


def fingerprint(cache: Any, layers: Sequence[int] | None = None, parts: str = "kv") -> str:
    """Digest of the state's bytes (all layers, or ``layers``; ``parts`` as in the module's docstring).

    A cache of attention layers only is the digest of its K and V tensors, layer by layer (the digests
    recorded in ledgers since the first version). A cache with recurrent state adds each layer's kind, every
    part by name and its counters' values. An engine's whole state is the digest of its bytes."""
    if isinstance(cache, whole.WholeState):
        return whole.fingerprint(cache, layers, parts)
    all_layers = layers_of(cache)
    idx = range(len(all_layers)) if layers is None else layers
    adapters = [adapter(layer) for layer in all_layers]
    if not recurrent(cache):
        ts = [p.tensor for i in idx for p in adapters[i].parts(all_layers[i]) if _selected(p, parts)]
        return fingerprint_tensors(ts, tag=parts.encode())
    h = digest(b"state|" + parts.encode())
    for i in idx:
        a, layer = adapters[i], all_layers[i]
        h.update(f"|{i}:{a.describe(layer)}|{sorted(a.counters(layer).items())}|".encode())
        for p in a.parts(layer):
            if _selected(p, parts):
                h.update(p.name.encode())
                add_tensor(h, p.tensor)
    return str(h.hexdigest())


def _diff(p: Part, q: Part) -> PartDiff:
    import torch

    a, b = p.tensor, q.tensor
    if a.shape != b.shape or a.dtype != b.dtype:
        return PartDiff(p.name, p.side, False, float("inf"), float("inf"))
    b = b.to(a.device)  # layers of a device-mapped model live on different devices
    if torch.equal(a, b):
        return PartDiff(p.name, p.side, True, 0.0, 0.0)
    if not (a.is_floating_point() or a.is_complex()):
        d = (a.to(torch.int64) - b.to(torch.int64)).abs()
        mx = float(d.max()) if d.numel() else 0.0
        return PartDiff(p.name, p.side, False, mx, mx, first_position(a, b, p.positional))
    d = (a.float() - b.float()).abs()
    mx = float(d.max())
    scale = float(b.float().abs().max()) or 1.0
    u = ulps(a, b)
    return PartDiff(p.name, p.side, False, mx, mx / scale, first_position(a, b, p.positional),
                    None if u is None else int(u.max()))


def compare(a: Any, b: Any) -> list[LayerComparison]:
    """Per layer and part: bit-identical (``torch.equal``), and how far apart when not (max-abs, relative to
    the other state's scale, the first differing position and the largest distance in ULPs); counters are
    compared as values. An engine's whole state is one row: bytes equal, and the first differing byte."""
    if isinstance(a, whole.WholeState):
        return whole.compare(a, b)
    la, lb = layers_of(a), layers_of(b)
    if len(la) != len(lb):
        raise UnsupportedCacheError(f"caches have {len(la)} and {len(lb)} layers: they come from different models")
    out = []
    for i, (x, y) in enumerate(zip(la, lb)):
        ax, ay = adapter(x), adapter(y)
        px, py = {p.name: p for p in ax.parts(x)}, {p.name: p for p in ay.parts(y)}
        if px.keys() != py.keys():
            raise UnsupportedCacheError(f"layer {i} holds {sorted(px)} in one state and {sorted(py)} in the other")
        diffs = tuple(_diff(px[n], py[n]) for n in px)
        out.append(LayerComparison(i, ax.describe(x), diffs, ax.counters(x) == ay.counters(y)))
    return out


def equal(a: Any, b: Any) -> bool:
    return all(c.equal for c in compare(a, b))


def clone(cache: Any) -> Any:
    """A deep copy that shares no storage with ``cache`` (an engine's state: saved and loaded into another
    context). An offloaded cache's prefetch stream is shared, not copied: it is a queue of work, not state,
    and a ``torch.Stream`` cannot be copied."""
    if isinstance(cache, whole.WholeState):
        return cache.clone()
    stream = getattr(cache, "prefetch_stream", None)
    return copy.deepcopy(cache, None if stream is None else {id(stream): stream})


def transplant(receiver: Any, donor: Any, layers: Sequence[int] | None = None, parts: str = "kv") -> Any:
    """A new cache: ``receiver`` with ``donor``'s state copied into ``layers`` (all by default), ``parts`` of
    each (the whole state by default). Neither input is modified. The two must hold the same positions. A
    preallocated (static) receiver keeps its tensors and gets the donor's copied into them. An engine's whole
    state moves whole or not at all (:func:`.whole.transplant`)."""
    if isinstance(receiver, whole.WholeState):
        return whole.transplant(receiver, donor, layers, parts)
    out = clone(receiver)
    dst, src = layers_of(out), layers_of(donor)
    if len(dst) != len(src):
        raise UnsupportedCacheError(f"donor has {len(src)} layers, receiver {len(dst)}: not the same model")
    for i in range(len(src)) if layers is None else layers:
        a = adapter(dst[i])
        mine = {p.name: p for p in a.parts(dst[i])}
        for p in adapter(src[i]).parts(src[i]):
            if not _selected(p, parts):
                continue
            if p.name not in mine or mine[p.name].tensor.shape != p.tensor.shape:
                have = tuple(mine[p.name].tensor.shape) if p.name in mine else "nothing"
                raise UnsupportedCacheError(f"layer {i}: donor {p.name} of shape {tuple(p.tensor.shape)} does not fit "
                                            f"the receiver's ({have})")
            a.write(dst[i], p.name, p.tensor)
    return out


def row_state(cache: Any, row: int, length: int) -> list[Any]:
    """The attention K/V of one row of a batched cache over its own last ``length`` positions (a left-padded
    row is right-aligned; a sliding layer holds at most its window of them), for the batch-invariance probe.
    A recurrent state has no positions to take a row's own from: refused."""
    out = []
    for layer in layers_of(cache):
        for p in adapter(layer).parts(layer):
            if not p.attention:
                raise UnsupportedCacheError("a recurrent state has read the padding of a left-padded row: "
                                            "batch invariance is not comparable")
            own = min(int(p.tensor.shape[-2]), length)
            out.append(p.tensor[row:row + 1, ..., p.tensor.shape[-2] - own:, :])
    return out
