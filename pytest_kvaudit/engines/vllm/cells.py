"""vLLM's cell builder: the shared request-level one (:class:`pytest_kvaudit.core.requests.cells.RequestCellBuilder`),
with vLLM's fp8 KV cache checked before the first cell (a machine that cannot hold it says so then)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_kvaudit.core.requests.cells import RequestCellBuilder
from pytest_kvaudit.engines.vllm import lossy

__all__ = ["VllmCellBuilder"]


class VllmCellBuilder(RequestCellBuilder):
    """A cell computed from vLLM requests."""

    def __init__(self, dec: Any, tokenizer: Any, cfg: Any, item_set: Any,
                 transplant: Callable[[Any, Any, Any, str], Any] | None = None,
                 max_positions: int | None = None) -> None:
        super().__init__(dec, tokenizer, cfg, item_set, transplant, max_positions)
        if lossy.KIND in cfg.cache_axes:
            lossy.check(cfg)
