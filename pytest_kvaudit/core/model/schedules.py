"""Constructions as chunk schedules: one registry, one entry per way of building a boundary state.

Every construction fills a fresh cache over ``prefix[:-1]`` in successive forwards whose lengths are its
*chunk schedule* (``live``/``incremental`` = ``[P, 1, 1, ...]``, ``prefill`` = ``[len]``, ``chunked(c)`` =
``[c, c, ..., rest]``). Constructions differ in nothing else: a continuation always starts by feeding
``prefix[-1]`` as one decode step. A new construction is a new entry, and it runs in every cell (it is
priced by the plan, compared in the report's construction axes and recorded in the ledger)::

    @register_schedule("halves")
    def halves(prompt_len, length, arg=None):
        return [length // 2, length - length // 2]

The built-in entries have their own roles in the cell (:mod:`.pipeline`): ``live`` is the trajectory,
``prefill`` and ``incremental`` are every cell's constructions, ``chunked(C)`` runs once per
``--kvaudit-chunks`` size. Every other registered name is an extra construction of every cell, in the
order of registration.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from pytest_kvaudit.core.errors import KvauditError

#: (prompt_len, length, argument or None) -> chunk lengths summing to length
ScheduleFn = Callable[[int, int, "int | None"], list[int]]

_SCHEDULES: dict[str, ScheduleFn] = {}
#: registered names that are extra constructions of every cell (a user's schedules), in registration order
_EXTRA: list[str] = []
#: registered names whose state is loaded, not computed: priced as no forwards (an engine's ``restore``)
_LOADED: set[str] = set()
_NAME = re.compile(r"([a-z_][a-z0-9_]*)(?:\((\d+)\))?")


def register_schedule(name: str, *, every_cell: bool = True,
                      forwards: bool = True) -> Callable[[ScheduleFn], ScheduleFn]:
    """Register ``fn`` as the chunk schedule ``name``; with ``every_cell`` (the default) every cell computes
    it as a construction. The built-in entries pass ``every_cell=False``: the pipeline gives them their roles,
    and so do a backend's own constructions (:mod:`pytest_kvaudit.core.model.engine_constructions`). ``forwards=False``:
    the state is loaded, not computed, and is priced as no forward."""
    if not _NAME.fullmatch(name) or "(" in name:
        raise KvauditError(f"schedule name {name!r}: use lowercase letters, digits and _ (an argument goes in the "
                           "construction's name, as chunked(4), not in the schedule's)")

    def deco(fn: ScheduleFn) -> ScheduleFn:
        _SCHEDULES[name] = fn
        if not forwards:
            _LOADED.add(name)
        if every_cell and name not in _EXTRA:
            _EXTRA.append(name)
        return fn

    return deco


def known() -> list[str]:
    return sorted(_SCHEDULES)


def extra_constructions() -> tuple[str, ...]:
    """The registered schedules that every cell computes besides the built-in ones, in registration order."""
    return tuple(_EXTRA)


def runs_forwards(construction: str) -> bool:
    """Whether ``construction``'s boundary state is computed by forwards (False: loaded, as ``restore``)."""
    return construction.split("(")[0] not in _LOADED


def unregister_schedule(name: str) -> None:
    """Forget a registered schedule (tests, and a notebook that registers one twice)."""
    _SCHEDULES.pop(name, None)
    if name in _EXTRA:
        _EXTRA.remove(name)


def schedule(construction: str, prompt_len: int, length: int) -> list[int]:
    """The chunk lengths of ``construction`` (``name`` or ``name(arg)``) over a ``prefix[:-1]`` of ``length``."""
    if length < 1:
        raise KvauditError("a boundary state needs at least one token before the prefix's last one")
    m = _NAME.fullmatch(construction)
    if not m or m.group(1) not in _SCHEDULES:
        raise KvauditError(f"unknown construction {construction!r}: use {', '.join(known())} (chunked takes (C))")
    arg = int(m.group(2)) if m.group(2) is not None else None
    chunks = _SCHEDULES[m.group(1)](prompt_len, length, arg)
    if sum(chunks) != length or any(c < 1 for c in chunks):
        raise KvauditError(f"construction {construction!r} gave the schedule {chunks}, not positive chunks summing to "
                           f"{length}")
    return chunks


@register_schedule("live", every_cell=False)
@register_schedule("incremental", every_cell=False)
def teacher_forced(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """The prompt in one forward, then one token a forward: how the live cache was built while generating
    (``live``), and its replay from the recorded ids on a fresh cache (``incremental``, the bridge)."""
    p = min(prompt_len, length)
    return [p] + [1] * (length - p)


@register_schedule("prefill", every_cell=False)
def prefill(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """One shot of the identical ids: what a stage-replay diagnostic does."""
    return [length]


@register_schedule("chunked", every_cell=False)
def chunked(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """Fixed-size chunks, as serving engines prefill: ``chunked(c)``."""
    if arg is None or arg < 1:
        raise KvauditError("chunked(C): the chunk size C must be a positive integer")
    return [arg] * (length // arg) + ([length % arg] if length % arg else [])
