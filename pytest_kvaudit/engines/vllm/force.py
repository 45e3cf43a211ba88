"""The teacher-forcing and stopping logits processor, at module level so that vLLM's executor can pickle it by
name into worker processes (``distributed_executor_backend="mp"``); importing this module imports vLLM."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from pytest_kvaudit.core.model.items import token_text
from pytest_kvaudit.core.requests.stop import StopRow
from pytest_kvaudit.engines.vllm.engine import FORCE, STOP


class ForceTokens(LogitsProcessor):  # type: ignore[misc]
    """Teacher-forces requests carrying ``extra_args[FORCE]``: while forced ids remain, every other logit of the
    row is -inf, so greedy sampling takes the forced id and the next step feeds it as a decode token. A request
    carrying ``extra_args[STOP]`` is ended the way the item set's stop rule ends a transformers suffix: once the
    suffix's text matches, the next token is forced to EOS (a stop token), so vLLM stops decoding there
    instead of at the budget, and the tokens up to the match are the ones a stopped decoder writes (the forced
    EOS is cut by :func:`pytest_kvaudit.core.requests.arithmetic.stopped`). The raw logits the audit reads are
    taken before any processor runs."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.rows: dict[int, StopRow] = {}
        self.model = vllm_config.model_config
        self._tokenizer: Any = None

    def decode(self, ids: Sequence[int]) -> str:
        if self._tokenizer is None:  # the stop rule reads text: the checkpoint's own tokenizer, loaded once
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.model.tokenizer,
                                                            trust_remote_code=self.model.trust_remote_code)
        return token_text(self._tokenizer, ids)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: Any) -> None:
        def new(params: Any, prompt: Any, out: list[int]) -> Any:
            extra = params.extra_args or {}
            force, stop = extra.get(FORCE), extra.get(STOP)
            return StopRow(force or [], stop, out) if force or stop else None

        process_dict_updates(self.rows, batch_update, new)

    def apply(self, logits: Any) -> Any:
        for i, row in self.rows.items():
            if len(row.out) < len(row.force):
                logits[i] = float("-inf")
                logits[i, row.force[len(row.out)]] = 0.0
            elif row.stop is not None and row.stops(self.decode):
                logits[i] = float("-inf")
                logits[i, int(row.stop["eos"])] = 0.0
        return logits
