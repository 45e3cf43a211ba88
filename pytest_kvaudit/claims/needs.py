"""The least forward tokens the claims need, priced apart from the forwards actually run.

``Cost.forward_tokens`` counts what the decoder ran. This module prices what the claims *need*: each claim
declares the groups of the cell's steps it reads (``Claim.needs``) and the records it judges
(``Claim.units``); their union, priced on the lengths the records show with the steps' own prices
(:mod:`pytest_kvaudit.engine.pipeline`), is the least work. Work that only analyses read (the layer sweep,
the attention and cache axes, batch invariance) and work done twice by mistake are not in it, so
``forward_tokens / minimal_forward_tokens`` is the honest overhead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.engine.pipeline import GROUPS, group_tokens
from pytest_kvaudit.engine.records import DONOR

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim
    from pytest_kvaudit.engine.config import AuditConfig


def minimal_tokens(claims: Iterable[Claim], records: Iterable[Any], config: AuditConfig) -> dict[str, int]:
    """Forward tokens per group that ``claims`` need over ``records`` (a store's, in item order); each
    (record, group) counted once however many claims need it."""
    recs = [r for r in records if not r.error]
    wanted: dict[tuple[int, str], Any] = {}
    for claim in claims:
        for r in claim.units(recs, config):
            for g in claim.needs:
                wanted[(id(r), g)] = r
    parts = dict.fromkeys(GROUPS, 0)
    for (_, g), r in wanted.items():
        if g == "transplants":
            parts[g] += group_tokens(r, g, r.whole_transplants())
        elif g == "controls":
            parts[g] += group_tokens(r, g, (t for t in r.transplants if t.kind != DONOR))
        else:
            parts[g] += group_tokens(r, g)
    return parts
