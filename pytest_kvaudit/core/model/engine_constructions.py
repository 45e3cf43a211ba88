"""Constructions that an engine builds by its own means rather than by a chunk schedule of forwards.

``warm``: the engine's own prompt cache. A first request with the prompt fills it; a second request,
``prefix[:-1]``, reuses what it can and evaluates the rest. The reused token count is recorded on the
continuation (``Continuation.reused``) as proof of the hit: a warm unit that reused nothing is not a warm
unit, and the construction axes count it apart (``warm_cold``).

``restore``: the live boundary state saved through the engine's save path and loaded back into a fresh
context: no forward at all.

Each is registered here as a schedule (``every_cell=False``: only a backend that declares it runs it), so
the plan, the pricing and a ledger read on a machine without the engine can price it: ``warm`` as the two
requests' evaluations (``[P, H - P]``, ``H`` tokens: the first request's prompt is work the engine did for
this unit), ``restore`` as no forwards (``forwards=False``).
"""

from __future__ import annotations

from pytest_kvaudit.core.model.schedules import register_schedule

WARM, RESTORE, BATCHED = "warm", "restore", "batched"


@register_schedule(WARM, every_cell=False)
def warm(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """The prompt (the first request), then the rest of ``prefix[:-1]`` (the second, on the warm cache). The
    first request stops one token short of ``prefix[:-1]`` so that the second always evaluates something (a
    request whose ids are all cached re-evaluates its last one, which no schedule over the ids can price)."""
    p = min(prompt_len, length - 1)
    return [p, length - p] if p >= 1 else [length]


@register_schedule(RESTORE, every_cell=False, forwards=False)
def restore(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """Loaded, not computed: priced as no forwards (the chunks are never run)."""
    return [length]


@register_schedule(BATCHED, every_cell=False)
def batched(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """vLLM's ``batched(B)``: ``prefix[:-1]`` prefilled in one engine step beside ``B`` other requests of its
    length, priced as its own tokens (the others' are the batch around it, counted in the run's cost)."""
    return [length]


@register_schedule("cross", every_cell=False)
def cross(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
    """vLLM's cross-request hit: another request writes the whole blocks of ``prefix[:-1]`` (one prefill), and
    the unit's request evaluates the rest on them; priced as ``prefix[:-1]`` once, in those two pieces."""
    return [length]
