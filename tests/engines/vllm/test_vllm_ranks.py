"""The ranks as one K/V store (:class:`pytest_kvaudit.engines.vllm.ranks.Ranks`), against a
stand-in for ``llm.collective_rpc`` that answers as vLLM's executor does (one result a rank, here out of
order): reads put every rank's heads in rank order, writes send each rank its own heads, and what kvaudit
cannot gather (pipeline stages, heads replicated across ranks) is one line. No vLLM needed."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.engines.vllm import ranks as vllm_ranks
from pytest_kvaudit.engines.vllm.layout import KvLayout

LAYERS, POSITIONS, HEAD = 3, 40, 8


class FakeLlm:
    """``tp`` ranks of ``heads`` KV heads each; rank r's K/V is filled with r + its own cell indices."""

    def __init__(self, tp: int, heads: int) -> None:
        lay = KvLayout("CPU_ATTN", "LBHNC", "rows", 32, 32, heads, HEAD)
        self.info = [{"rank": r, "tp": tp, "layout": lay.as_dict(), "attention_backend": "CPU_ATTN", "isa": "n/a",
                      "dtype": "torch.bfloat16", "shape": [heads, 32, 2 * HEAD], "layers": LAYERS} for r in range(tp)]
        self.store = [torch.arange(LAYERS * 2 * heads * POSITIONS * HEAD, dtype=torch.float32)
                      .reshape(LAYERS, 2, heads, POSITIONS, HEAD) + 1000 * r for r in range(tp)]
        self.written: list[int] = []

    def collective_rpc(self, fn: Any, args: tuple[Any, ...] = ()) -> list[Any]:
        ranks = list(range(len(self.info)))[::-1]  # answered out of order: the store sorts by rank
        if fn is vllm_ranks.describe_rank:
            return [self.info[r] for r in ranks]
        if fn is vllm_ranks.read_rank:
            return [(r, self.store[r].clone()) for r in ranks]
        assert fn is vllm_ranks.write_rank
        _, per_rank = args
        for r in ranks:
            self.store[r] = per_rank[r].clone()
            self.written.append(r)
        return ranks


def test_a_read_puts_every_ranks_heads_in_rank_order_and_a_write_sends_each_its_own() -> None:
    llm = FakeLlm(tp=2, heads=1)
    ranks = vllm_ranks.Ranks(llm, total_kv_heads=2, pipeline=1)
    layers = ranks.read([0, 1], POSITIONS)
    assert len(layers) == LAYERS and layers[0].shape == (2, 2, POSITIONS, HEAD)
    for r in range(2):  # head r is rank r's
        assert all(torch.equal(layers[i][:, r], llm.store[r][i, :, 0]) for i in range(LAYERS))
    changed = [t.clone() for t in layers]
    changed[2][1, 1] += 1  # V of head 1, layer 2: rank 1's alone
    ranks.write([0, 1], changed)
    assert sorted(llm.written) == [0, 1]
    assert torch.equal(llm.store[0][:, :, 0], torch.stack(layers)[:, :, 0])  # rank 0 got its head back as it was
    assert not torch.equal(llm.store[1][2, 1, 0], layers[2][1, 1])
    assert torch.equal(llm.store[1][2, 1, 0], changed[2][1, 1])
    assert all(torch.equal(a, b) for a, b in zip(ranks.read([0, 1], POSITIONS), changed))


def test_pipeline_stages_and_replicated_heads_are_one_line() -> None:
    with pytest.raises(UnsupportedCacheError, match="pipeline_parallel_size=2: .* not available"):
        vllm_ranks.Ranks(FakeLlm(tp=1, heads=2), total_kv_heads=2, pipeline=2)
    with pytest.raises(UnsupportedCacheError,
                       match="tensor_parallel_size=4 over 2 KV heads replicates heads .* not available"):
        vllm_ranks.Ranks(FakeLlm(tp=4, heads=1), total_kv_heads=2, pipeline=1)
    llm = FakeLlm(tp=2, heads=1)
    llm.info[1]["layout"] = llm.info[1]["layout"] | {"layout": "LBNHC"}
    with pytest.raises(UnsupportedCacheError, match="the ranks declare different K/V layouts"):
        vllm_ranks.Ranks(llm, total_kv_heads=2, pipeline=1)
