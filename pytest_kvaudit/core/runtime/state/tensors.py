"""Digests and distances of raw tensors: what every layer kind's fingerprint and comparison are made of.

A fingerprint is XXH3-128 over each tensor's dtype, shape and raw bytes, so equal digests mean bit-identical
tensors. Any tensor can be fingerprinted: empty ones, 0-d counters, non-contiguous views, every dtype
(float8 and integer state included). Distances between two float tensors are given in ULPs (units in the
last place of their dtype), the unit engine users compare kernels in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_kvaudit.core.model.digests import digest


def tensor_bytes(t: Any) -> memoryview:
    """The raw bytes of a tensor, on the host, without a dtype round trip (a 0-d tensor is one element, an
    empty one no bytes)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous().reshape(-1)
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.view(torch.uint8).numpy()).cast("B")


def add_tensor(h: Any, t: Any) -> None:
    h.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(tensor_bytes(t))


def fingerprint_tensors(tensors: Iterable[Any], tag: bytes = b"") -> str:
    """XXH3-128 over dtype, shape and raw bytes of each tensor: equal digest <=> bit-identical."""
    h = digest(tag)
    for t in tensors:
        add_tensor(h, t)
    return str(h.hexdigest())


#: float dtype -> the signed integer of its width, to count ULPs between two values
def _int_of(dtype: Any) -> Any:
    import torch

    return {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
            torch.float64: torch.int64}.get(dtype)


def ulps(a: Any, b: Any) -> Any:
    """Elementwise distance between two float tensors of one dtype in units in the last place (int64), or
    None for a dtype without one (integers, float8). Sign-magnitude bits are mapped to an ordered integer line,
    so -0.0 and +0.0 are 0 apart and neighbouring floats 1 apart."""
    import torch

    it = _int_of(a.dtype)
    if it is None or a.dtype != b.dtype:
        return None
    width = torch.iinfo(it).bits

    def ordered(x: Any) -> Any:
        i = x.contiguous().view(it).to(torch.int64)
        return torch.where(i < 0, -(2 ** (width - 1)) - i, i)

    return (ordered(a) - ordered(b.to(a.device))).abs()


def first_position(a: Any, b: Any, positional: bool) -> int | None:
    """The first position (axis -2 of a K/V tensor) where ``a`` and ``b`` differ; for a tensor without a
    position axis, the first differing element in row-major order."""
    import torch

    ne = a != b.to(a.device)
    if a.is_floating_point():
        ne = ne & ~(torch.isnan(a) & torch.isnan(b.to(a.device)))
    if positional and ne.dim() >= 2:
        ne = ne.transpose(-2, -1).reshape(-1, ne.shape[-2]).any(dim=0)
    idx = ne.reshape(-1).nonzero()
    return int(idx[0]) if idx.numel() else None
