"""The teacher-forcing and stopping logits processor, at module level so that vLLM's executor can pickle it by
name into worker processes (``distributed_executor_backend="mp"``); importing this module imports vLLM."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from vllm.v1.sample.logits_processor import LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import find_boundary, token_text
from pytest_kvaudit.engines.vllm.engine import FORCE, STOP


class _Row:
    """One request's forced ids and stop rule (:data:`.engine.STOP`), with its output ids (vLLM's list)."""

    def __init__(self, force: Sequence[int], stop: dict[str, Any] | None, out: list[int]) -> None:
        self.force, self.out, self.stop = list(force), out, stop
        self.start: int | None = None  # where the suffix starts in ``out`` (found once for a boundary rule)
        if stop is not None and stop.get("after") is not None:
            self.start = int(stop["after"])
        self.rule = (BoundaryRule(marker=stop.get("marker"), tokens=stop.get("tokens"))
                     if stop is not None and self.start is None else None)

    def stops(self, decode: Any) -> bool:
        """Whether the suffix so far (``lead`` then ``out`` past its start) matches the stop regex: the item
        set's stop rule (:func:`pytest_kvaudit.core.model.items.stopper`), checked before each step."""
        assert self.stop is not None
        if self.start is None:
            if self.rule is None:
                return False
            b = find_boundary(self.out, self.rule, decode)
            if b is None:
                return False
            self.start = b
        lead = self.stop.get("lead") or []
        if len(self.out) < self.start or not (lead or len(self.out) > self.start):
            return False
        return re.search(self.stop["regex"], decode([*lead, *self.out[self.start:]])) is not None


class ForceTokens(LogitsProcessor):  # type: ignore[misc]
    """Teacher-forces requests carrying ``extra_args[FORCE]``: while forced ids remain, every other logit of the
    row is -inf, so greedy sampling takes the forced id and the next step feeds it as a decode token. A request
    carrying ``extra_args[STOP]`` is ended the way the item set's stop rule ends a transformers suffix: once the
    suffix's text matches, the next token is forced to EOS (a stop token), so vLLM stops decoding there
    instead of at the budget, and the tokens up to the match are the ones a stopped decoder writes (the forced
    EOS is cut by :func:`pytest_kvaudit.engines.vllm.requests.stopped`). The raw logits the audit reads are
    taken before any processor runs."""

    def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}
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
            return _Row(force or [], stop, out) if force or stop else None

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
