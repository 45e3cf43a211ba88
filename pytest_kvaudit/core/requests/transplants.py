"""The anatomy and the transplants of a divergent request-level cell (:mod:`.cells`).

A transplant is one request over ``prefix[:-1]`` with ``prefix[-1]`` forced: its prefill runs, then the composed
state is written over every position of its blocks before the first decode step reads them
(:func:`continue_warm`; a paged prefix cache keeps whole blocks only, so a hit could not carry the tail of a
boundary that is not on a block edge). ``requests[path]["covered"]`` says how many positions moved.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.records import DONOR, IDENTICAL, SHAM, CellRecord, Transplant
from pytest_kvaudit.core.requests.arithmetic import margins, stopped


def anatomy(rec: CellRecord, states: dict[str, Any], decode: Callable[[Sequence[int]], str], kv: Any) -> None:
    """The cell's divergence anatomy: per-layer drift of live vs cold, and where the warm, cross and live
    states first differ from cold (layer, position, ULPs), read through ``kv`` (the engine's state reader)."""
    layers = kv.compare(states["live"], states["prefill"])
    c = rec.comparison
    c.drift = [[x.layer, x.keys_max_abs, x.values_max_abs, x.keys_rel, x.values_rel] for x in layers]
    c.differing_layers = [x.layer for x in layers if not x.equal]
    c.identical_layers = [x.layer for x in layers if x.equal]
    # warm's whole blocks are the live request's, written by decode; cold's (prefill's) by one prefill
    for name in ("warm", "cross", "live"):
        if states.get(name) is not None:
            c.first_difference[f"{name}_vs_cold"] = kv.first_difference(states[name], states["prefill"])
    live, pre = rec.constructions["live"].suffix, rec.constructions["prefill"].suffix
    j = next((i for i, (x, y) in enumerate(zip(live, pre)) if x != y), None)
    if j is not None:
        c.divergence_text = [decode([live[j]]), decode([pre[j]])]


def transplant_plan(identical_layers: Sequence[int],
                    controls: bool = True) -> list[tuple[str, str, str, tuple[int, ...] | None, str]]:
    """``(kind, donor, receiver, layers, path)`` of each transplant a divergent request-level cell runs: both donors,
    and (``controls``) both shams and the identical layers alone where some are."""
    plan: list[tuple[str, str, str, tuple[int, ...] | None]] = [(DONOR, d, r, None)
                                                                for d, r in (("live", "prefill"), ("prefill", "live"))]
    if controls:
        plan += [(SHAM, n, n, None) for n in ("prefill", "live")]
        if identical_layers:
            plan += [(IDENTICAL, d, r, tuple(identical_layers)) for d, r in (("live", "prefill"), ("prefill", "live"))]
    return [(kind, d, r, layers, f"transplant:{d}_to_{r}" if kind == DONOR else (
        f"transplant:sham:{r}" if kind == SHAM else f"transplant:{kind}:{d}_to_{r}")) for kind, d, r, layers in plan]


def continue_warm(b: Any, rec: CellRecord, path: str, state: Any, prefix: Sequence[int], budget: int) -> Any:
    """Continue from ``state`` over ``prefix[:-1]``: one cold request prefills ``prefix[:-1]`` (in one step, or in
    several under a small token budget), then, between its last prefill step and the first decode step (which
    feeds ``prefix[-1]``, forced), ``state`` is written over the request's blocks, every position of ``prefix[:-1]``
    and no other (the tail of a partial last block included). Returns the continuation (its tokens after
    ``prefix[-1]``)."""
    h = len(prefix) - 1
    n = -(-h // b.block)
    if state.positions != h:
        raise KvauditError(f"{b.cfg.engine.name}: {path} writes a state of {state.positions} positions over "
                           f"prefix[:-1]'s {h}")
    b.be.hooks.between = lambda blocks: b.be.write(blocks[:n], state)  # exactly prefix[:-1]'s positions
    try:
        d = b.request(rec, path, prefix[:-1], prefix[-1:], budget)
        fired = b.be.hooks.between is None
    finally:
        b.be.hooks.between = None
    if d.cached or sum(d.prefill_chunks) != h or len(d.steps) <= len(d.prefill_chunks):
        raise KvauditError(f"{b.cfg.engine.name}: {path} did not prefill prefix[:-1] before decoding "
                           f"(cached {d.cached}, steps {[s for s, _ in d.steps[:4]]})")
    # the proof: once the request is done, its blocks hold exactly what was written over prefix[:-1]
    if not fired or b.kv.fingerprint(b.be.read(d.blocks, h)) != b.kv.fingerprint(state):
        raise KvauditError(f"{b.cfg.engine.name}: {path}: the written K/V did not hold in the request's blocks (the "
                           f"write ran {'too early' if fired else 'never'}); its continuation would not be the "
                           "transplant's")
    rec.requests[path]["covered"] = h
    return replace(d, tokens=d.tokens[1:], rows=d.rows[1:])


def transplants(b: Any, rec: CellRecord, live: Any, prefill: Any, prefix: Sequence[int], budget: int,
                controls: bool = True) -> None:
    """Each planned transplant (:func:`transplant_plan`) written into the cached blocks of ``prefix`` and
    continued warm; its suffix set against the donor's and the receiver's own."""
    states = {"live": live, "prefill": prefill}
    for kind, donor, receiver, layers, path in transplant_plan(rec.comparison.identical_layers, controls):
        composed = b.transplant_fn(states[receiver], states[donor], layers, "kv")
        d = continue_warm(b, rec, path, composed, prefix, budget)
        suffix, rows = stopped(b.dec.stop, d.tokens, d.rows)
        m = margins(rows)
        target, own = rec.constructions[donor].suffix, rec.constructions[receiver].suffix
        rec.transplants.append(Transplant(f"{donor}_to_{receiver}", layers, "kv", suffix, suffix == target, kind,
                                          suffix == own,
                                          tuple(round(x, 6) for x in m), b.decode(suffix)))
