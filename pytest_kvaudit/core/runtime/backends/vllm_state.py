"""A request's K/V as vLLM keeps it: whole blocks of the runner's per-layer cache tensors, copied out.

The CPU attention backend's per-layer tensor is ``[num_blocks, kv_heads, block_size, 2 * head_dim]``, which
its kernels view as ``[num_blocks, kv_heads, 2 * block_size, head_dim]``: a block's K rows, then its V rows
(``vllm/v1/attention/backends/cpu_attn.py``). :class:`VllmState` keeps the blocks as copied and reads K and V
per position from them. The fingerprint is the digest of the blocks' bytes sliced to the state's positions;
the comparison names, per layer, the first position where K or V differ and the distance there in ULPs
(:func:`pytest_kvaudit.core.runtime.state.tensors.ulps`); a transplant composes two states layer by layer before the blocks are written.

On the AMX ISA (bf16) the kernels may keep a block's rows in their own packing: the bytes, the layers and the
blocks stay exact, and a position is then the row inside that packing (the report says which ISA ran).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.runtime.state.protocol import LayerComparison, PartDiff
from pytest_kvaudit.core.runtime.state.tensors import fingerprint_tensors, first_position, ulps


@dataclass
class VllmState:
    """The K/V over ``positions`` positions: per layer, the blocks ``[n, kv_heads, block_size, 2*head_dim]``."""

    layers: list[Any]
    positions: int
    block_size: int

    def kv(self, layer: int) -> tuple[Any, Any]:
        """(K, V) of one layer, ``[kv_heads, positions, head_dim]`` each."""
        t = self.layers[layer]
        n, heads, b, width = t.shape
        t = t.reshape(n, heads, 2 * b, width // 2)
        k, v = t[:, :, :b], t[:, :, b:]
        return tuple(x.permute(1, 0, 2, 3).reshape(heads, n * b, width // 2)[:, : self.positions] for x in (k, v))

    def clone(self) -> VllmState:
        return VllmState([t.clone() for t in self.layers], self.positions, self.block_size)


def fingerprint(state: VllmState) -> str:
    """Digest of every layer's K and V over the state's positions (equal digest <=> bit-identical)."""
    return fingerprint_tensors((x for i in range(len(state.layers)) for x in state.kv(i)), tag=b"vllm-kv")


def _part(side: str, a: Any, b: Any) -> PartDiff:
    import torch

    if torch.equal(a, b):
        return PartDiff(side, side, True, 0.0, 0.0)
    d = (a.float() - b.float()).abs()
    u = ulps(a, b)
    return PartDiff(side, side, False, float(d.max()), float(d.max()) / (float(b.float().abs().max()) or 1.0),
                    first_position(a, b, True), None if u is None else int(u.max()))


def compare(a: VllmState, b: VllmState) -> list[LayerComparison]:
    """Per layer: K and V bit-identical or not, the first differing position and the largest ULP distance."""
    return [LayerComparison(i, "full", tuple(_part(s, x, y) for s, x, y in zip("kv", a.kv(i), b.kv(i))))
            for i in range(len(a.layers))]


def first_difference(a: VllmState, b: VllmState) -> dict[str, Any] | None:
    """Where two states first part: the first layer whose K or V differ, the first position there, and the
    ULP distance at that position (largest over its heads and dims) and over the whole layer."""
    for i in range(len(a.layers)):
        for side, x, y in zip("kv", a.kv(i), b.kv(i)):
            pos = first_position(x, y, True)
            if pos is None:
                continue
            u = ulps(x, y)
            return {"layer": i, "part": side, "position": pos, "block": pos // a.block_size,
                    "ulps_at_position": None if u is None else int(u[:, pos].max()),
                    "max_ulps_in_layer": None if u is None else int(u.max())}
    return None


def transplant(receiver: VllmState, donor: VllmState, layers: Sequence[int] | None = None, parts: str = "kv") -> VllmState:
    """A new state: ``receiver`` with ``donor``'s blocks in ``layers`` (all by default). Whole blocks move, K and V
    together: a K-only or V-only transplant is not available (the engine keeps them in one block)."""
    if parts != "kv":
        raise UnsupportedCacheError(f"the vllm backend keeps K and V in one block: a {parts!r}-only transplant is not available")
    out = receiver.clone()
    for i in range(len(out.layers)) if layers is None else layers:
        out.layers[i] = donor.layers[i].clone()
    return out
