"""The teacher-forcing logits processor, at module level so that vLLM's executor can pickle it by name into
worker processes (``distributed_executor_backend="mp"``); importing this module imports vLLM."""

from __future__ import annotations

from typing import Any

from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from pytest_kvaudit.core.runtime.backends.vllm_engine import FORCE


class ForceTokens(LogitsProcessor):  # type: ignore[misc]
    """Teacher-forces requests carrying ``extra_args[FORCE]``: while forced ids remain, every other logit of the
    row is -inf, so greedy sampling takes the forced id and the next step feeds it as a decode token. The raw
    logits the audit reads are taken before any processor runs."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[int], list[int]]] = {}

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        def new(params: Any, prompt: Any, out: list[int]) -> Any:
            force = (params.extra_args or {}).get(FORCE)
            return (list(force), out) if force else None

        process_dict_updates(self.rows, batch_update, new)

    def apply(self, logits: Any) -> Any:
        for i, (force, out) in self.rows.items():
            if len(out) < len(force):
                logits[i] = float("-inf")
                logits[i, force[len(out)]] = 0.0
        return logits
