"""The stop rule of one request, as a request-level engine applies it while it decodes: a request whose suffix's
text matches the item set's stop regex is ended the way a transformers suffix is
(:func:`pytest_kvaudit.core.model.items.stopper`). vLLM checks it in its logits processor; any engine that decodes
step by step can do the same."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import find_boundary

__all__ = ["StopRow"]


class StopRow:
    """One request's forced ids and stop rule (:func:`.arithmetic.stop_rule`'s dict), with its output ids (the
    engine's list, growing as it decodes)."""

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
