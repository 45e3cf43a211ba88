"""Every rank's K/V through vLLM's own executor: ``llm.collective_rpc(fn)`` runs ``fn(worker, ...)`` on each
rank (in process at TP=1, in each worker process under ``distributed_executor_backend="mp"``) and returns the
results in rank order.

The functions that run on a rank are module-level, so the executor pickles them by reference and the worker
imports this module. Under tensor parallelism rank ``r`` holds KV heads ``[r * h, (r + 1) * h)`` of every
layer (``h`` = total / TP), in the same block ids (one scheduler allocates for all ranks): a read concatenates
the ranks' heads, which is the TP=1 tensor, and a write sends each rank its own heads. TP beyond the KV heads
(heads replicated across ranks) and pipeline parallelism (each rank a slice of the layers) are refused in one
line each.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.engines.vllm.engine import NAME, attention_backend, attention_isa
from pytest_kvaudit.engines.vllm.layout import KvLayout, layout_of


def _runner_layout(worker: Any) -> tuple[Any, KvLayout]:
    runner = worker.model_runner
    groups = [g for gs in runner.attn_groups for g in gs]
    if len(groups) != 1:
        raise UnsupportedCacheError(f"{NAME}: {len(groups)} attention groups (a hybrid model, or backends mixed): one "
                                    "is supported")
    g = groups[0]
    layout = runner.cache_config.get_resolved_kv_cache_layout()
    return runner, layout_of(g.backend, g.kv_cache_spec, layout, runner.kv_caches[0], attention_isa(runner))


def describe_rank(worker: Any) -> dict[str, Any]:
    """On a rank: its TP rank and size, the layout it declares and what the ledger records of it."""
    from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

    runner, lay = _runner_layout(worker)
    kv = runner.kv_caches[0]
    return {"rank": int(get_tensor_model_parallel_rank()), "tp": int(get_tensor_model_parallel_world_size()),
            "layout": lay.as_dict(), "attention_backend": attention_backend(runner), "isa": attention_isa(runner),
            "dtype": str(kv.dtype), "shape": [int(x) for x in kv.shape[1:]], "layers": len(runner.kv_caches)}


def read_rank(worker: Any, blocks: Sequence[int], positions: int) -> tuple[int, Any]:
    """On a rank: (its TP rank, ``[layers, 2, its kv_heads, positions, head_dim]``)."""
    import torch
    from vllm.distributed import get_tensor_model_parallel_rank

    runner, lay = _runner_layout(worker)
    return int(get_tensor_model_parallel_rank()), torch.stack([lay.read(kv, blocks, positions)
                                                               for kv in runner.kv_caches])


def write_rank(worker: Any, blocks: Sequence[int], per_rank: Sequence[Any]) -> int:
    """On a rank: write its own heads (``per_rank[rank]``, ``[layers, 2, heads, positions, head_dim]``)."""
    from vllm.distributed import get_tensor_model_parallel_rank

    runner, lay = _runner_layout(worker)
    rank = int(get_tensor_model_parallel_rank())
    for kv, layer in zip(runner.kv_caches, per_rank[rank]):
        lay.write(kv, blocks, layer)
    return rank


class Ranks:
    """The engine's ranks as one K/V store: what each declares, read across all of them, written to all."""

    def __init__(self, llm: Any, total_kv_heads: int, pipeline: int) -> None:
        if pipeline > 1:
            raise UnsupportedCacheError(f"{NAME}: pipeline_parallel_size={pipeline}: each rank would hold a slice of "
                                        "the layers; not available (tensor parallelism is)")
        self.llm = llm
        self.info = sorted(llm.collective_rpc(describe_rank), key=lambda d: d["rank"])
        self.tp = len(self.info)
        layouts = {tuple(sorted(d["layout"].items())) for d in self.info}
        if len(layouts) != 1:
            raise UnsupportedCacheError(f"{NAME}: the ranks declare different K/V layouts: {sorted(layouts)}")
        self.layout = KvLayout(**self.info[0]["layout"])
        if self.layout.kv_heads * self.tp != total_kv_heads:
            raise UnsupportedCacheError(f"{NAME}: tensor_parallel_size={self.tp} over {total_kv_heads} KV heads "
                                        f"replicates heads across ranks ({self.layout.kv_heads} a rank): not "
                                        f"available; use a TP that divides {total_kv_heads}")

    def read(self, blocks: Sequence[int], positions: int) -> list[Any]:
        """Per layer, ``[2, kv_heads, positions, head_dim]`` with every rank's heads in order."""
        import torch

        parts = sorted(self.llm.collective_rpc(read_rank, args=(list(blocks), positions)), key=lambda x: x[0])
        if [r for r, _ in parts] != list(range(self.tp)):
            raise UnsupportedCacheError(f"{NAME}: a read answered from ranks {[r for r, _ in parts]}, "
                                        f"not 0..{self.tp - 1}")
        return list(torch.cat([t for _, t in parts], dim=2).unbind(0))

    def write(self, blocks: Sequence[int], layers: Sequence[Any]) -> None:
        """Write ``layers`` (as :meth:`read` returns them) to every rank, each its own heads."""
        import torch

        per_rank = [t.contiguous() for t in torch.stack(list(layers)).split(self.layout.kv_heads, dim=2)]
        done = sorted(self.llm.collective_rpc(write_rank, args=(list(blocks), per_rank)))
        if done != list(range(self.tp)):
            raise UnsupportedCacheError(f"{NAME}: a write reached ranks {done}, not 0..{self.tp - 1}")
