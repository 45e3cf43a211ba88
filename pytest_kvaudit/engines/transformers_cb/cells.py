"""One cell on transformers' continuous batching: the core's request-level cell builder
(:mod:`pytest_kvaudit.core.requests.cells`, the one vLLM's cells run), over this engine's requests. Every
construction is one request on a cold cache (every cached page evicted first), its K/V read from its pages as it
finished; the prefix cache's three hit shapes (partial at the item's own boundary, whole-block at the nearest page
edge, cross-request on pages another request wrote) are proven by the match the cache found for the request; a
transplant is written into the request's pages between its prefill step and its first decode step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_kvaudit.core.compute.cells import prompt_ids
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.requests.cells import RequestCellBuilder
from pytest_kvaudit.engines.transformers_cb.settings import NAME

__all__ = ["CbCellBuilder"]


class CbCellBuilder(RequestCellBuilder):
    """A cell computed from continuous-batching requests; refuses, before the first cell, a cache too small to
    hold what a cell keeps at once."""

    def __init__(self, dec: Any, tokenizer: Any, cfg: Any, item_set: Any,
                 transplant: Callable[[Any, Any, Any, str], Any] | None = None,
                 max_positions: int | None = None) -> None:
        super().__init__(dec, tokenizer, cfg, item_set, transplant, max_positions)
        check_capacity(self.be, cfg, item_set, tokenizer)

    def request(self, rec: Any, name: str, first: Any, force: Any, budget: int, reset: bool = True, others: int = 0,
                tokens: int | None = None, stop: Any = True) -> Any:
        """One request (:meth:`RequestCellBuilder.request`). The cross-request hit's writer decodes two tokens, not one:
        transformers registers a page for sharing after the step that filled it only while the request is still
        running (``PagedAttentionCache.mark_complete_blocks`` skips a finished request), so a request that ends in
        its prefill step shares none of its prompt's pages."""
        if name.endswith(":writer"):
            budget = max(budget, 2)
        return super().request(rec, name, first, force, budget, reset, others, tokens, stop)


def check_capacity(be: Any, cfg: Any, item_set: Any, tokenizer: Any) -> None:
    """One line when the longest item cannot be served with what a cell keeps cached beside it: the live request's
    pages stay cached while a hit runs, ``batched(B)`` serves ``B`` more at once, and the scheduler evicts every
    cached page once the free share falls under its safety margin."""
    s = be.settings
    longest = max((len(prompt_ids(it, tokenizer, cfg.chat_template, cfg.model)) for it in item_set.items
                   if it.prompt_ids is not None or it.prompt is not None), default=0) + item_set.max_new_tokens
    pages = -(-longest // s.page_size) + 1
    at_once = max(2, 1 + int(getattr(cfg, "batch_size", 0) or 0))
    need = -(-int(pages * at_once) // 1)
    usable = int(s.num_blocks * (1.0 - s.safety_margin))
    if need > usable:
        raise KvauditError(f"--kvaudit-engine-arg num_blocks={s.num_blocks}: {NAME} needs {need} pages of "
                           f"{s.page_size} free under its safety margin {s.safety_margin} (the longest item, "
                           f"{longest} positions, {at_once} requests at once); give num_blocks="
                           f"{-(-need // (1.0 - s.safety_margin)):.0f} or more")
