"""Where one rank of a vLLM engine keeps a position's K and V, read from what the running backend declares.

vLLM 0.32.0 gives every attention layer the same *logical* cache shape, ``[blocks, kv_heads, N, C]`` with
``N`` a kernel block's tokens and ``C`` the content (``2 * head_size`` elements;
``v1/kv_cache_interface.py: compute_layer_kv_cache_shape_bytes``, ``create_kv_cache_views``). The *memory*
order under that view is the layout the engine resolved from its backends' ``supported_kv_cache_layouts()``
(``v1/attention/backends/utils.py: get_supported_kv_cache_layouts``; strides by ``compute_layout_strides``):
CPU_ATTN is head-major (LBHNC); FLASH_ATTN, TRITON_ATTN and FLEX_ATTENTION token-major (LBNHC); FLASHINFER
head-major on compute capability 10, else token-major. Reading through the logical view makes the memory order
irrelevant to the values, and :meth:`KvLayout.check` proves the tensor is in the layout declared.

What the logical view does not say is where K ends and V begins inside a block, which is each backend's own
convention (its forward's split), kept in :data:`PACKING`:

- ``content``: a token's content is ``[K | V]`` (``kv_cache.transpose(1, 2).split(head_size, -1)``:
  ``flash_attn.py``, ``triton_attn.py``, ``flex_attention.py``, ``flashinfer.py``);
- ``kernel``: the page's order is the kernel's own, per ISA (``cpu_attn.py`` views a head's page as
  ``[2 * N, head_size]``, K then V, but the C++ ``reshape_and_cache`` of the ``vec`` ISA writes K
  *column-major*, ``[head_size, N]``, and V row-major; the AMX and NEON kernels pack their own ways). So the
  map from (K or V, head, row, dim) to an offset in the page is *probed*: the engine's own
  ``cpu_attn_reshape_and_cache`` writes a page of known codes once per (ISA, dtype, shape)
  (:func:`probe_page`), and reads and writes go through that map. A read in any other order is a
  permutation of the truth: harmless to a fingerprint of full blocks, wrong for a position, a partial block or
  a transplant.

A backend named in neither, MLA's latent cache and per-token quantised caches are refused in one line.
Positions map to cells as vLLM's slot mapping does: position ``p`` of a request holding manager blocks
``ids`` is slot ``p % block_size`` of block ``ids[p // block_size]``, which is row ``slot % N`` of kernel
block ``id * (block_size // N) + slot // N`` (``group_kernel_blocks``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError

#: each backend's split of a block into K and V (see the module docstring)
PACKING = {"CPU_ATTN": "kernel", "FLASH_ATTN": "content", "TRITON_ATTN": "content", "FLEX_ATTENTION": "content",
           "FLASHINFER": "content", "ROCM_ATTN": "content", "ROCM_AITER_UNIFIED_ATTN": "content"}


@dataclass(frozen=True)
class KvLayout:
    """One rank's K/V cache as its attention backend declares it."""

    backend: str  # the attention backend's name (``get_name()``)
    layout: str  # the resolved ``KVCacheLayout``: memory order of the logical [L, B, H, N, C]
    packing: str  # ``rows`` or ``content`` (:data:`PACKING`)
    block_size: int  # the manager's block: what the scheduler's block ids count
    kernel_block_size: int  # N: tokens per kernel block (divides block_size)
    kv_heads: int  # KV heads on this rank
    head_size: int
    isa: str = ""  # the CPU attention kernel's ISA (``kernel`` packing: its page map is probed per ISA)
    dtype: str = ""  # the cache's torch dtype (``kernel`` packing)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        kernel = f", kernel blocks of {self.kernel_block_size}" if self.kernel_block_size != self.block_size else ""
        return f"{self.backend} {self.layout} ({self.packing}-packed K/V{kernel})"

    def slots(self, blocks: Sequence[int], positions: int) -> tuple[Any, Any]:
        """(kernel block, row in it) of each of the first ``positions`` positions held in ``blocks``."""
        import torch

        p = torch.arange(positions)
        ids = torch.as_tensor(list(blocks), dtype=torch.long)
        if -(-positions // self.block_size) > len(ids):
            raise UnsupportedCacheError(f"vllm: {positions} positions need {-(-positions // self.block_size)} blocks "
                                        f"of {self.block_size}, the request held {len(ids)}")
        slot = p % self.block_size
        ratio = self.block_size // self.kernel_block_size
        return ids[p // self.block_size] * ratio + slot // self.kernel_block_size, slot % self.kernel_block_size

    def _page(self) -> Any:
        """``kernel`` packing: per (side, head, row, dim), the element's offset inside a kernel block's page."""
        import torch

        return probe_page(self.isa, getattr(torch, self.dtype.removeprefix("torch.")), self.kv_heads,
                          self.kernel_block_size, self.head_size)

    def _flat(self, cache: Any, blocks: Sequence[int], positions: int, side: int) -> tuple[Any, Any]:
        """``kernel`` packing: the cache's storage as one flat tensor and the offsets of ``side`` for each of
        the first ``positions`` positions, ``[positions, heads, head_size]``."""

        kb, row = self.slots(blocks, positions)
        page = self._page()[side]  # [H, N, hs]
        offsets = kb[:, None, None] * cache.stride(0) + page[:, row].permute(1, 0, 2)
        size = (cache.shape[0] - 1) * cache.stride(0) + cache[0].numel()
        return cache.as_strided((size,), (1,), cache.storage_offset()), offsets.to(cache.device)

    def _cells(self, side: int, row: Any) -> tuple[Any, Any]:
        """(logical N index, first content element) of K (side 0) or V (side 1) at each kernel-block row."""
        if self.packing == "content":
            return row, row * 0 + side * self.head_size
        r = row + side * self.kernel_block_size  # rows: the head page as [2N, head_size]
        return r // 2, (r % 2) * self.head_size

    def _index(self, blocks: Sequence[int], positions: int, side: int) -> tuple[Any, Any, Any]:
        import torch

        kb, row = self.slots(blocks, positions)
        n, c0 = self._cells(side, row)
        cols = c0[:, None] + torch.arange(self.head_size)[None, :]
        return kb[:, None], n[:, None], cols

    def read(self, cache: Any, blocks: Sequence[int], positions: int) -> Any:
        """K and V of the first ``positions`` positions, ``[2, kv_heads, positions, head_size]`` (a copy)."""
        import torch

        out = []
        for side in (0, 1):
            if self.packing == "kernel":
                flat, offsets = self._flat(cache, blocks, positions, side)
                out.append(flat[offsets].permute(1, 0, 2))  # [P, H, hs] -> [H, P, hs]
                continue
            kb, n, cols = self._index(blocks, positions, side)
            kb, n, cols = (x.to(cache.device) for x in (kb, n, cols))
            out.append(cache[kb, :, n, cols].permute(2, 0, 1))  # [P, hs, H] -> [H, P, hs]
        return torch.stack(out).cpu()

    def write(self, cache: Any, blocks: Sequence[int], kv: Any) -> None:
        """Overwrite the cells of ``kv``'s positions (``[2, kv_heads, positions, head_size]``) in place."""
        for side in (0, 1):
            if self.packing == "kernel":
                flat, offsets = self._flat(cache, blocks, int(kv.shape[2]), side)
                flat[offsets] = kv[side].permute(1, 0, 2).to(device=cache.device, dtype=cache.dtype)
                continue
            kb, n, cols = self._index(blocks, int(kv.shape[2]), side)
            kb, n, cols = (x.to(cache.device) for x in (kb, n, cols))
            cache[kb, :, n, cols] = kv[side].permute(1, 2, 0).to(device=cache.device, dtype=cache.dtype)

    def check(self, cache: Any) -> None:
        """The tensor is this layout's: the logical shape, and strides in the declared memory order."""
        from vllm.v1.kv_cache_layout import KVCacheLayout

        shape = tuple(cache.shape)
        if len(shape) != 4 or shape[1:] != (self.kv_heads, self.kernel_block_size, 2 * self.head_size):
            raise UnsupportedCacheError(f"vllm: {self.backend}'s cache has shape {shape}, not the logical [blocks, "
                                        f"{self.kv_heads}, {self.kernel_block_size}, {2 * self.head_size}]")
        order = [d for d in KVCacheLayout[self.layout].layer_view_order if shape[d] > 1]
        strides = [cache.stride(d) for d in order]
        if strides != sorted(strides, reverse=True):
            raise UnsupportedCacheError(f"vllm: {self.backend}'s cache strides {tuple(cache.stride())} are not the "
                                        f"declared layout {self.layout}")


def packing(backend: str) -> str:
    """The backend's K/V split, or one line saying it is not known."""
    if backend not in PACKING:
        raise UnsupportedCacheError(f"vllm: the K/V split of attention backend {backend} is not known to kvaudit "
                                    f"(known: {', '.join(sorted(PACKING))}); run with VLLM_ATTENTION_BACKEND set to "
                                    "one")
    return PACKING[backend]


_PAGES: dict[tuple[str, Any, int, int, int], Any] = {}


def probe_page(isa: str, dtype: Any, heads: int, n: int, head_size: int) -> Any:
    """Where the CPU attention kernel of ``isa`` puts each element of a kernel block's page: ``[2, heads, n,
    head_size]`` offsets into the page ``[heads, n, 2 * head_size]`` (K then V), found by letting the engine's own
    ``cpu_attn_reshape_and_cache`` write a page of codes (row, dim and head, each + 1: exact in bf16 and fp16),
    once per (ISA, dtype, shape). A page the kernel does not fill one to one is refused in one line."""
    key = (isa, dtype, heads, n, head_size)
    if key in _PAGES:
        return _PAGES[key]
    import torch
    from vllm import _custom_ops as ops

    if max(n, head_size, heads) + 1 > 256:
        raise UnsupportedCacheError(f"vllm: a page of {n} tokens x {head_size} x {heads} heads is too large to probe")
    codes = {"row": lambda t, h, d: t + 1, "dim": lambda t, h, d: d + 1, "head": lambda t, h, d: h + 1}
    t, h, d = torch.meshgrid(torch.arange(n), torch.arange(heads), torch.arange(head_size), indexing="ij")
    found: dict[tuple[int, str], Any] = {}
    for side in (0, 1):
        for name, code in codes.items():
            cache = torch.full((1, heads, n, 2 * head_size), -1.0, dtype=dtype)
            k_cache, v_cache = cache.view(1, heads, 2 * n, head_size).chunk(2, dim=2)
            values = code(t, h, d).to(dtype)
            zeros = torch.zeros_like(values)
            kv = (values, zeros) if side == 0 else (zeros, values)
            ops.cpu_attn_reshape_and_cache(kv[0], kv[1], k_cache, v_cache, torch.arange(n), isa)
            found[(side, name)] = cache.flatten()
    page = torch.full((2, heads, n, head_size), -1, dtype=torch.long)
    for side in (0, 1):
        at = (found[(side, "row")] >= 1).nonzero().flatten()
        rows, dims, hs = (found[(side, k)][at].long() - 1 for k in ("row", "dim", "head"))
        page[side, hs, rows, dims] = at
    if (page < 0).any() or page.flatten().unique().numel() != page.numel():
        raise UnsupportedCacheError(f"vllm: the CPU attention kernel ({isa}) does not write one page cell per K/V "
                                    "element: its page cannot be read")
    _PAGES[key] = page
    return page


def layout_of(backend: Any, spec: Any, layout: Any, cache: Any, isa: str = "") -> KvLayout:
    """The :class:`KvLayout` of one cache tensor bound to ``backend`` (a class), ``spec`` (its KVCacheSpec)
    and ``layout`` (the resolved ``KVCacheLayout``)."""
    from vllm.v1.kv_cache_interface import AttentionSpec, KVQuantMode, MLAAttentionSpec

    name = str(backend.get_name())
    if isinstance(spec, MLAAttentionSpec):
        raise UnsupportedCacheError(f"vllm: {name} keeps MLA's latent cache (one compressed K/V per token), not "
                                    "per-head K and V: not available")
    if not isinstance(spec, AttentionSpec):
        raise UnsupportedCacheError(f"vllm: a {type(spec).__name__} cache is not attention K/V: not available")
    if spec.kv_quant_mode not in (KVQuantMode.NONE, KVQuantMode.FP8_PER_TENSOR) or spec.head_size_v != spec.head_size:
        raise UnsupportedCacheError(f"vllm: {name}'s cache ({spec.kv_quant_mode.name}, head sizes {spec.head_size}/"
                                    f"{spec.head_size_v}) is not plain K/V: not available")
    kind = packing(name)
    if kind == "kernel" and not isa:
        raise UnsupportedCacheError(f"vllm: {name}'s page order is its kernel's, per ISA, and no ISA was given")
    out = KvLayout(name, layout.name, kind, int(spec.block_size), int(cache.shape[2]), int(spec.num_kv_heads),
                   int(spec.head_size), isa if kind == "kernel" else "", str(cache.dtype) if kind == "kernel" else "")
    out.check(cache)
    return out
