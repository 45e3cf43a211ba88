"""A request's K/V as a paged engine keeps it (vLLM, transformers' continuous batching), copied out of its blocks
on every rank into one layout-free form.

Each attention backend keeps K and V in its own layout inside the blocks (the engine's backend reads and writes
through it: vLLM's :mod:`pytest_kvaudit.engines.vllm.layout`), and under tensor parallelism each rank holds some of
the KV heads. :class:`PagedState` keeps, per layer, the request's K and V
over its positions with every rank's heads in order, ``[2, kv_heads, positions, head_dim]``: the same tensor
whatever the backend, the layout or the TP degree, so a state from TP=2 equals TP=1's head for head. The
fingerprint is the digest of K and V per layer; the comparison names, per layer, the first position where K or
V differ and the distance there in ULPs (:func:`pytest_kvaudit.core.runtime.state.tensors.ulps`); a transplant
composes two states layer by layer before they are written back to every rank.

On the AMX ISA (bf16) the CPU kernels may keep a block's rows in their own packing: the bytes, the layers and the
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
class PagedState:
    """The K/V over ``positions`` positions: per layer, ``[2, kv_heads, positions, head_dim]`` (K, then V), every
    rank's heads in order; ``block_size`` is the engine's block (the report names a position's block)."""

    layers: list[Any]
    positions: int
    block_size: int
    tensor_parallel: int = 1  # ranks the heads were gathered from

    def kv(self, layer: int) -> tuple[Any, Any]:
        """(K, V) of one layer, ``[kv_heads, positions, head_dim]`` each."""
        t = self.layers[layer]
        return t[0], t[1]

    def clone(self) -> PagedState:
        return PagedState([t.clone() for t in self.layers], self.positions, self.block_size, self.tensor_parallel)


def fingerprint(state: PagedState) -> str:
    """Digest of every layer's K and V over the state's positions (equal digest <=> bit-identical)."""
    # the tag is its first engine's, kept: the ledgers' fingerprints hold it
    return fingerprint_tensors((x for i in range(len(state.layers)) for x in state.kv(i)), tag=b"vllm-kv")


def _part(side: str, a: Any, b: Any) -> PartDiff:
    import torch

    if torch.equal(a, b):
        return PartDiff(side, side, True, 0.0, 0.0)
    d = (a.float() - b.float()).abs()
    u = ulps(a, b)
    return PartDiff(side, side, False, float(d.max()), float(d.max()) / (float(b.float().abs().max()) or 1.0),
                    first_position(a, b, True), None if u is None else int(u.max()))


def compare(a: PagedState, b: PagedState) -> list[LayerComparison]:
    """Per layer: K and V bit-identical or not, the first differing position and the largest ULP distance."""
    return [LayerComparison(i, "full", tuple(_part(s, x, y) for s, x, y in zip("kv", a.kv(i), b.kv(i))))
            for i in range(len(a.layers))]


def first_difference(a: PagedState, b: PagedState) -> dict[str, Any] | None:
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


def transplant(receiver: PagedState, donor: PagedState, layers: Sequence[int] | None = None,
               parts: str = "kv") -> PagedState:
    """A new state: ``receiver`` with ``donor``'s K and/or V (``parts``: ``kv``, ``k`` or ``v``) in ``layers``
    (all by default). The write puts each back in its own cells of the blocks, whatever the backend's layout."""
    if parts not in ("kv", "k", "v"):
        raise UnsupportedCacheError(f"a transplant moves 'kv', 'k' or 'v', not {parts!r}")
    if (donor.positions, donor.tensor_parallel) != (receiver.positions, receiver.tensor_parallel):
        raise UnsupportedCacheError(f"a transplant needs states of one shape: {donor.positions} positions from "
                                    f"TP={donor.tensor_parallel} into {receiver.positions} from "
                                    f"TP={receiver.tensor_parallel}")
    out = receiver.clone()
    sides = [i for i, s in enumerate("kv") if s in parts]
    for i in range(len(out.layers)) if layers is None else layers:
        out.layers[i][sides] = donor.layers[i][sides]
    return out
