"""An engine's read of its K/V cache checked against an outside oracle: transformers' own forward of the same ids.

Every claim compares kvaudit's read of one state with kvaudit's read of another, so a read that is wrong the same
way every time (K read in the wrong order inside each block, as vLLM's CPU_ATTN once was) fails no claim. The
oracle does not go through kvaudit at all: :func:`reference_kv` runs ``model(ids, use_cache=True)`` on a fresh
``DynamicCache`` and takes each layer's ``keys``/``values`` from transformers' own cache object, and
:func:`check_read` sets an engine's read of the same ids against it, per layer and per side (K, V):

- ``rel``: the largest difference relative to the layer's largest reference value (the tolerance of an FP32
  read: kernels differ in rounding, never in which position a row is);
- ``misplaced``: the read's rows whose nearest reference row (Euclidean, over every head and dim) is strictly
  nearer than their own position's. A token repeated in the prompt gives equal V rows at layer 0 (V carries
  no position), so a tie with another position is not a miss. This holds in BF16 too, where the values differ
  by more than a tolerance would allow.

For engine authors: read the engine's cache of a prompt into ``[(K, V), ...]`` per layer, each ``[kv_heads,
positions, head_dim]`` (a leading batch axis of one is dropped), and call
``check_read(read, reference_kv(model, ids)).assert_ok(rtol)``. :func:`permute_in_blocks` builds the broken read
that such a test must fail on. Torch is imported lazily; pytest never.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FP32_RTOL", "LayerCheck", "OracleCheck", "check_read", "permute_in_blocks", "reference_kv"]

#: the relative tolerance of an FP32 read, as a fraction of each layer's largest reference value. Measured on an
#: AMD EPYC (AVX512-BF16) CPU, 2026-12-07: vLLM's CPU_ATTN 1.0e-6 on the embedded checkpoint (4 layers) and 3.7e-6
#: on SmolLM2-135M (30 layers; issue 44 saw 1.1e-5 on another prompt); transformers' own caches after a prefill
#: and one-token steps 4.6e-7. A read whose positions are permuted inside a block is off by the values themselves
#: (1e-1 and more). 1e-4 leaves a decade over the deepest model measured and three under a misread
FP32_RTOL = 1e-4


@dataclass(frozen=True)
class LayerCheck:
    """One side (``k`` or ``v``) of one layer of a read set against the oracle."""

    layer: int
    side: str
    #: max |read - reference| / max |reference| over the layer's side
    rel: float
    #: (row of the read, the reference position strictly nearest to it) for every row nearer another position
    misplaced: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class OracleCheck:
    """A whole read against the oracle (:func:`check_read`)."""

    checks: tuple[LayerCheck, ...]
    positions: int

    @property
    def max_rel(self) -> float:
        return max((c.rel for c in self.checks), default=0.0)

    @property
    def misplaced(self) -> int:
        """Rows, over every layer and side, nearest another position than their own."""
        return sum(len(c.misplaced) for c in self.checks)

    def problems(self, rtol: float | None = None) -> list[str]:
        """One line per layer side that misses: rows at the wrong position, or (``rtol`` given) too far off."""
        out = []
        for c in self.checks:
            if c.misplaced:
                rows = ", ".join(f"{r}->{p}" for r, p in c.misplaced[:6])
                out.append(f"layer {c.layer} {c.side.upper()}: {len(c.misplaced)}/{self.positions} rows nearest "
                           f"another position (read row -> nearest reference position: {rows})")
            if rtol is not None and not c.rel <= rtol:
                out.append(f"layer {c.layer} {c.side.upper()}: max relative error {c.rel:.3g} > {rtol:g}")
        return out

    def assert_ok(self, rtol: float | None = None) -> None:
        """Raise AssertionError listing every miss (``rtol``: also the FP32 tolerance; None: positions only)."""
        problems = self.problems(rtol)
        if problems:
            raise AssertionError(f"the read disagrees with transformers' forward of the same ids "
                                 f"(max relative error {self.max_rel:.3g}):\n" + "\n".join(problems))


def reference_kv(model: Any, ids: Sequence[int]) -> list[tuple[Any, Any]]:
    """Per layer, (K, V) ``[kv_heads, positions, head_dim]`` from transformers' own forward of ``ids`` on a fresh
    ``DynamicCache``, read through transformers' cache object, not kvaudit's. The cache is made without the
    model's config, so every layer keeps every position (a sliding-window layer's too: its attention still
    slides, by the mask)."""
    import torch
    from transformers import DynamicCache

    from pytest_kvaudit.core.runtime.state.forward_kwarg import cache_kwarg

    x = torch.tensor([list(ids)], dtype=torch.long, device=next(model.parameters()).device)
    cache: Any = DynamicCache()
    with torch.no_grad():
        model(input_ids=x, use_cache=True, **{cache_kwarg(model): cache})
    return [(layer.keys[0].detach().cpu(), layer.values[0].detach().cpu()) for layer in cache.layers]


def _rows(t: Any) -> Any:
    """``[heads, positions, dim]`` (or with a batch axis of one) as float64 rows ``[positions, heads * dim]``."""
    import torch

    if t.dim() == 4:
        if t.shape[0] != 1:
            raise ValueError(f"a read of one prompt has a batch of one, not {tuple(t.shape)}")
        t = t[0]
    return t.detach().cpu().to(torch.float64).transpose(0, 1).reshape(t.shape[1], -1)


def _side(layer: int, side: str, read: Any, ref: Any, positions: Sequence[int]) -> LayerCheck:
    import torch

    r, f = _rows(read), _rows(ref)
    if r.shape[0] != len(positions) or r.shape[1] != f.shape[1]:
        raise ValueError(f"layer {layer} {side.upper()}: the read holds {tuple(r.shape)} (positions, heads*dim), "
                         f"the oracle {tuple(f.shape)} for positions {positions[0]}..{positions[-1]}")
    own = torch.as_tensor(list(positions), dtype=torch.long)
    rel = float((r - f[own]).abs().max()) / (float(f.abs().max()) or 1.0)
    # every read row against every reference row, without the matmul shortcut: equal rows give equal distances
    d = torch.cdist(r, f, compute_mode="donot_use_mm_for_euclid_dist")
    mine = d.gather(1, own[:, None])[:, 0]
    best, at = d.min(dim=1)
    miss = (mine > best).nonzero().flatten().tolist()
    return LayerCheck(layer, side, rel, tuple((int(i), int(at[i])) for i in miss))


def check_read(read: Sequence[tuple[Any, Any]], reference: Sequence[tuple[Any, Any]],
               positions: Sequence[int] | None = None) -> OracleCheck:
    """An engine's read ``[(K, V), ...]`` against :func:`reference_kv` of the same ids. ``positions``: the reference
    position of each row the read holds; by default a layer holding ``n`` rows of the oracle's ``P`` holds the last
    ``n`` (all of them for a full layer, its window for a sliding-window layer)."""
    if len(read) != len(reference):
        raise ValueError(f"the read holds {len(read)} layers, the oracle {len(reference)}")
    checks = []
    for i, ((k, v), (rk, rv)) in enumerate(zip(read, reference)):
        n, total = int(k.shape[-2]), int(rk.shape[-2])
        pos = list(range(total - n, total)) if positions is None else list(positions)
        checks += [_side(i, "k", k, rk, pos), _side(i, "v", v, rv, pos)]
    return OracleCheck(tuple(checks), len(pos) if read else 0)


def permute_in_blocks(positions: int, block: int) -> list[int]:
    """An index that reverses the order of positions inside each block of ``block`` (a partial last block too):
    ``read[..., index, :]`` is the read a layout bug gives, every value present, each at another position."""
    out: list[int] = []
    for start in range(0, positions, block):
        out += list(range(min(start + block, positions) - 1, start - 1, -1))
    return out
