"""What the audit reads off transformers' continuous-batching loop, hooked onto one manager's batch processor without
changing what it computes.

The manager runs its loop in a thread of its own; these hooks run in that thread:

- ``PagedAttentionCache.search_prefix_match`` is wrapped: what it returns for a request is the proof of its hit
  (the tokens whose blocks it shares instead of computing), the same number transformers logs as "Found a prefix
  match of N tokens for request R";
- ``Scheduler.schedule_batch`` is wrapped: the tokens each request was given in each engine step (the chunked-prefill
  proof) and how many requests the step ran;
- ``Scheduler.finish_request`` is wrapped: a request's block table is deleted when it finishes, so its block ids and
  the K/V of its pages are taken just before;
- ``ContinuousBatchProcessor.update_batch`` is wrapped: once the first request of a call has its first token (its
  prompt's K/V are in its pages and no decode step has read them), :attr:`Hooks.between` runs on its blocks, in
  the loop's own thread, so no forward runs while it writes (a transplant);
- a logits processor is appended to the manager's list: it keeps the top-k raw logits of every step, teacher-forces
  the ids a request carries (every other logit -inf, so greedy decoding takes them as decode steps) and ends a
  request where the item set's stop rule ends its suffix (the next token forced to EOS).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.requests.stop import StopRow
from pytest_kvaudit.engines.transformers_cb.settings import NAME, internal


@dataclass
class Job:
    """One request's forced ids and stop rule (:class:`pytest_kvaudit.core.requests.stop.StopRow`), and what the
    loop saw of it."""

    row: StopRow
    eos: int | None = None
    rows: list[list[tuple[int, float]]] = field(default_factory=list)
    matched: int = 0
    blocks: list[int] = field(default_factory=list)
    pages: Any = None  # per layer [2, kv_heads, len(blocks) * page, head_dim], taken as it finished
    steps: list[tuple[int, int]] = field(default_factory=list)


class Hooks:
    """The hooks on one manager (module docstring); ``jobs`` holds the requests of the call under way."""

    def __init__(self, manager: Any, decode: Callable[[Sequence[int]], str], top_k: int) -> None:
        bp = internal(manager, "batch_processor")
        self.cache, self.scheduler = internal(bp, "cache"), internal(bp, "scheduler")
        self.io = internal(bp, "inputs_and_outputs")
        allocators = list(internal(self.cache, "cache_allocators").values())
        if len(allocators) != 1 or type(allocators[0]).__name__ != "FullAttentionCacheAllocator":
            kinds = ", ".join(type(a).__name__ for a in allocators)
            raise KvauditError(f"{NAME}: this model's cache is {kinds}; the engine reads one full-attention group "
                               "(a model with sliding-window or MLA layers is not supported)")
        self.allocator = allocators[0]
        self.page = int(internal(self.allocator, "tokens_per_page"))
        self.layers = list(internal(self.allocator, "layer_indices"))
        self.pages_stride = int(internal(self.allocator, "block_physical_stride")) // self.page
        internal(self.allocator, "get_cache_for_block_table")
        internal(self.allocator, "block_table")
        self.decode, self.top_k = decode, top_k
        self.jobs: dict[str, Job] = {}
        self.first: str | None = None
        self.between: Callable[[list[int]], None] | None = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self._wrap(bp)
        processors = internal(manager, "logit_processor")
        internal(processors, "logits_processor").append(_Processor(self))
        processors.do_processing = True

    def _wrap(self, bp: Any) -> None:
        search, schedule = internal(self.cache, "search_prefix_match"), internal(self.scheduler, "schedule_batch")
        finish, update = internal(self.scheduler, "finish_request"), internal(bp, "update_batch")

        def searching(request_id: str, prompt_ids: list[int]) -> int:
            n = int(search(request_id, prompt_ids))
            if request_id in self.jobs:
                self.jobs[request_id].matched = n
            return n

        def scheduling(*a: Any, **kw: Any) -> Any:
            out = schedule(*a, **kw)
            if out[0]:
                for fs in out[0]:
                    job = self.jobs.get(fs.state.request_id)
                    if job is not None:
                        job.steps.append((int(fs.query_length), len(out[0])))
            return out

        def finishing(request_id: str) -> Any:
            job = self.jobs.get(request_id)
            if job is not None:
                job.blocks = list(self.allocator.block_table.get(request_id, []))
                job.pages = self.read_pages(job.blocks)
            return finish(request_id)

        def updating(*a: Any, **kw: Any) -> Any:
            out = update(*a, **kw)
            first = self.jobs.get(self.first or "")
            if self.between is not None and first is not None and first.rows:
                fn, self.between = self.between, None  # its prompt's K/V are in its pages; no decode step read them
                try:
                    fn(list(self.allocator.block_table.get(self.first, first.blocks)))
                except BaseException as exc:  # said on the caller's side: an error here would end the loop
                    self.error = exc
            return out

        self.cache.search_prefix_match = searching
        self.scheduler.schedule_batch = scheduling
        self.scheduler.finish_request = finishing
        bp.update_batch = updating

    # -- pages ----------------------------------------------------------------------------------
    def views(self, layer: int) -> tuple[Any, Any]:
        """The layer's K and V page views, ``[pages, page, kv_heads, head_dim]`` (``get_cache_for_block_table``)."""
        return self.allocator.get_cache_for_block_table(layer)  # type: ignore[no-any-return]

    def read_pages(self, blocks: Sequence[int]) -> list[Any]:
        """Per layer ``[2, kv_heads, len(blocks) * page, head_dim]``: a copy of the K and V in ``blocks``."""
        import torch

        idx = torch.tensor([b * self.pages_stride for b in blocks], dtype=torch.long)
        out = []
        for layer in self.layers:
            k, v = self.views(layer)
            kv = torch.stack([k.index_select(0, idx), v.index_select(0, idx)])  # [2, n, page, heads, dim]
            out.append(kv.flatten(1, 2).transpose(1, 2).contiguous())
        return out

    def write_pages(self, blocks: Sequence[int], layers: Sequence[Any], positions: int) -> None:
        """Write ``layers`` (per layer ``[2, kv_heads, positions, head_dim]``) into the first ``positions`` cells of
        ``blocks``, every layer; the rest of a partial last page is left as it is."""
        for i, layer in enumerate(self.layers):
            k, v = self.views(layer)
            for side, view in enumerate((k, v)):
                rows = layers[i][side].transpose(0, 1)  # [positions, heads, dim]
                for j, b in enumerate(blocks):
                    lo = j * self.page
                    if lo >= positions:
                        break
                    hi = min(positions, lo + self.page)
                    view[b * self.pages_stride, : hi - lo].copy_(rows[lo:hi])


class _Processor:
    """Keeps each step's top-k raw logits per request, teacher-forces and stops (the module docstring)."""

    supports_continuous_batching = True

    def __init__(self, hooks: Hooks) -> None:
        self.hooks = hooks

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        h = self.hooks
        states = [fs.state for fs in h.io.requests_in_batch if fs.has_new_token]
        for i, state in enumerate(states):
            job = h.jobs.get(state.request_id)
            if job is None:
                continue
            row = scores[i]
            vals, ids = row.topk(min(h.top_k + 8, row.shape[-1]))
            top = sorted(zip(ids.tolist(), vals.tolist()), key=lambda x: (-x[1], x[0]))[: h.top_k]
            job.rows.append([(int(t), float(x)) for t, x in top])
            r = job.row
            r.out = list(state.generated_tokens)
            forced = r.force[len(r.out)] if len(r.out) < len(r.force) else None
            if forced is None and r.stop is not None and job.eos is not None and r.stops(h.decode):
                forced = job.eos
            if forced is not None:
                scores[i] = float("-inf")
                scores[i, forced] = 0.0
        return scores
