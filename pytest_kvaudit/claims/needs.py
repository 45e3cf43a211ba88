"""What the selected claims need: the work a run computes, and the least forward tokens, priced apart from
the forwards actually run.

Each claim declares what it reads (``Claim.needs``: groups of the cell's steps or constructions by name) and
the records it judges (``Claim.units``). A run computes what its selected claims need (:func:`work`, into
``AuditConfig.work``) and nothing else, so ``--kvaudit-claims=ledger_audit``, ``-k`` or a user's own claim
alone cost what they read; a claim that declares nothing gets everything, and so does a run of every
built-in claim (every analysis included). ``Cost.forward_tokens`` counts what the decoder ran; the union of
the selected claims' needs, priced on the lengths the records show with the steps' own prices
(:mod:`pytest_kvaudit.core.model.pipeline`), is the least work, so ``forward_tokens / minimal_forward_tokens``
is the honest overhead. The analyses (the layer sweep, the axes, batch invariance) are never in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.pipeline import (
    BASE,
    CAPABILITIES,
    GROUPS,
    construction_tokens,
    group_tokens,
    step_named,
    unknown_needs,
    work_of,
)
from pytest_kvaudit.core.model.records import DONOR

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim
    from pytest_kvaudit.core.model.config import AuditConfig

CONSTRUCTION = "construction:"


def builtin(claim: Claim) -> bool:
    """A claim kvaudit ships (one module each in this package), not a user's."""
    return type(claim).__module__.startswith("pytest_kvaudit.claims.")


def everything(claims: Sequence[Claim], every_builtin: Iterable[Claim]) -> bool:
    """Whether a run of ``claims`` computes everything: one declares nothing, or every built-in claim runs."""
    if any(c.needs is None for c in claims):
        return True
    names = {c.name for c in claims}
    return all(c.name in names for c in every_builtin)


def work(claims: Sequence[Claim], config: AuditConfig, every_builtin: Iterable[Claim],
         analyses: Sequence[str] = ()) -> tuple[str, ...] | None:
    """What a run of ``claims`` computes (``AuditConfig.work``; None: everything): their needs, the analyses
    they quote and those asked for (``--kvaudit-analyses``), closed over what each step reads. A need that names nothing
    this run computes is an error naming the claim (a construction the run was not asked for, such as ``chunked(8)``
    without
    ``--kvaudit-chunks=8``)."""
    if everything(claims, every_builtin):
        return None
    # a claim that does not apply to this run (no prefix cache to audit, a need the backend lacks) is skipped,
    # saying why: it adds no work, and its needs are not this run's to check
    claims = [c for c in claims if c.applicable(config) is None]
    for c in claims:
        bad = unknown_needs([*(c.needs or ()), *c.analyses], config)
        if bad:
            raise KvauditError(f"claim {c.name} needs {', '.join(map(repr, bad))}, which this run does not compute: "
                               f"name groups ({', '.join(GROUPS)}), analyses ({', '.join(CAPABILITIES)}) or "
                               "constructions of the run (prefill, incremental, chunked(C) with --kvaudit-chunks=C)")
    return work_of([*(n for c in claims for n in (*(c.needs or ()), *c.analyses)), *analyses])


def _keys(need: str, r: Any) -> Iterable[str]:
    """The priced parts of record ``r`` that ``need`` names: a group, or constructions by name."""
    if need == "constructions":
        return [CONSTRUCTION + k for k in r.constructions if step_named(k).group == "constructions" and k != "live"]
    if need in GROUPS:
        return [need]
    if need in CAPABILITIES:  # an analysis is never in the least work
        return []
    return [CONSTRUCTION + need]


def minimal_tokens(claims: Iterable[Claim], records: Iterable[Any], config: AuditConfig) -> dict[str, int]:
    """Forward tokens per group that ``claims`` need over ``records`` (a store's, in item order); each
    (record, part) counted once however many claims need it. Any claim needs the base (the trajectory and
    the prefill of every record: eligibility and divergence rest on them); one that declares nothing needs
    every group."""
    recs = [r for r in records if not r.error]
    wanted: dict[tuple[int, str], Any] = {}
    for claim in claims:
        if not wanted:
            for r in recs:
                for need in BASE:
                    for key in _keys(need, r):
                        wanted[(id(r), key)] = r
        for r in claim.units(recs, config):
            for need in GROUPS if claim.needs is None else claim.needs:
                for key in _keys(need, r):
                    wanted[(id(r), key)] = r
    parts = dict.fromkeys(GROUPS, 0)
    for (_, key), r in wanted.items():
        if key.startswith(CONSTRUCTION):
            parts["constructions"] += construction_tokens(r, key[len(CONSTRUCTION):])
        elif key == "transplants":
            parts[key] += group_tokens(r, key, r.whole_transplants())
        elif key == "controls":
            parts[key] += group_tokens(r, key, (t for t in r.transplants if t.kind != DONOR))
        else:
            parts[key] += group_tokens(r, key)
    return parts
