"""The prefix cache's three hit shapes in a request-level cell, each with the engine's proof (the count of cached
prompt tokens it reports for the request: vLLM's ``num_cached_tokens``):

- **partial** (``warm``): ``prefix`` requested right after ``live``, at the item's own boundary. The engine reuses
  the whole blocks the live request wrote while decoding and prefills the tail after the last full block
  again, as in every multi-turn chat. Judged against live and against cold (``prefill``);
- **whole-block** (``requests["warm:block"]``): the same hit at the nearest block edge inside the working
  (:func:`.arithmetic.block_edge`), an extra construction beside the item's own boundary: all of
  ``prefix[:-1]`` is reused and ``prefix[-1]`` computed alone, so it must be the live request bit for bit
  (blocks, suffix, top-k logits);
- **cross-request** (``cross``): the cold construction's request on blocks that *another* request wrote, one
  that shares the prefix's whole blocks and nothing after (:func:`.arithmetic.other_tail`).

A request that hit nothing is recorded with ``num_cached_tokens == 0`` and never counted as a hit. ``b`` is the
cell builder (:class:`.cells.RequestCellBuilder`): its backend ``b.be``, its state reader ``b.kv``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from pytest_kvaudit.core.model.records import CellRecord
from pytest_kvaudit.core.requests.arithmetic import (
    block_edge,
    cacheable,
    logits_fp,
    margins,
    other_tail,
    perturbed,
    stopped,
)

WARM, WHOLE, CROSS = "warm", "warm:block", "cross"


def fault_blocks(b: Any, blocks: Sequence[int], positions: int, path: str) -> None:
    """The state fault hook on the whole cached blocks of ``positions`` before a hit (tests: one perturbed
    block must show)."""
    whole = (positions // b.block) * b.block
    if b.dec.faults.state is not None and whole:
        b.be.write(blocks, perturbed(b.dec.faults.state, b.be.read(blocks, whole), path))


def partial(b: Any, rec: CellRecord, prefix: tuple[int, ...], budget: int, live: Any, live_state: Any) -> Any:
    """``prefix`` on the blocks the live request left cached: whole blocks reused, the tail prefilled."""
    h = len(prefix) - 1
    fault_blocks(b, live.blocks, h, WARM)
    d = b.request(rec, WARM, prefix, (), budget, reset=False)
    state = b.be.read(d.blocks, h)
    rec.comparison.first_difference["warm_vs_live"] = b.kv.first_difference(state, live_state)
    tokens, rows = stopped(b.dec.stop, d.tokens, d.rows)
    cont = b.labelled(rec, tokens, b.kv.fingerprint(state), logits_fp(rows), margins(rows),
                      prefix[len(rec.prompt_ids):])
    rec.constructions[WARM] = replace(cont, reused=d.cached)
    rec.requests[WARM]["tail"] = h - d.cached
    return state


def whole_block(b: Any, rec: CellRecord, live: Any, max_new: int) -> None:
    """The hit at the nearest block edge inside the working, set against the live request there."""
    prompt, marker = rec.prompt_ids, rec.boundary
    assert marker is not None
    eos = [k for k, t in enumerate(live.tokens) if t in b.dec.eos_ids]
    bw = block_edge(len(prompt), marker, b.block, min(max_new, eos[0] + 1 if eos else len(live.tokens)))
    if bw is None:
        rec.requests[WHOLE] = {"num_cached_tokens": 0, "boundary": None,
                               "reason": f"no block edge inside the working (prompt {len(prompt)}, block {b.block})"}
        return
    prefix = tuple(prompt) + tuple(live.tokens[:bw])
    h = len(prefix) - 1
    ref = b.be.read(live.blocks, h)  # the live request's own blocks, before any fault
    fault_blocks(b, live.blocks, h, WHOLE)
    # it stops where the live request stopped: the stop rule reads the suffix from the item's own boundary
    lead, after = (list(live.tokens[marker:bw]), 0) if bw > marker else ([], marker - bw)
    d = b.request(rec, WHOLE, prefix, (), max_new - bw, reset=False, stop=b.stop_rule(after, lead))
    got = b.be.read(d.blocks, h)
    tokens, rows = stopped(b.dec.stop, d.tokens, d.rows)
    want, want_rows = stopped(b.dec.stop, live.tokens[bw:], live.rows[bw:])
    rec.requests[WHOLE].update({
        "boundary": bw, "blocks_equal": b.kv.fingerprint(got) == b.kv.fingerprint(ref), "suffix_equal": tokens == want,
        "logits_equal": logits_fp(rows) == logits_fp(want_rows), "first_difference": b.kv.first_difference(got, ref),
        "suffix": list(tokens), "live_suffix": list(want)})


def cross(b: Any, rec: CellRecord, prefix: tuple[int, ...], budget: int) -> Any:
    """The cold construction's request over ``prefix[:-1]`` (``prefix[-1]`` forced) on whole blocks that
    another request wrote; None when the prefix has no whole block to share."""
    h = len(prefix) - 1
    shared = cacheable(h, b.block)
    if not shared:
        rec.requests[CROSS] = {"num_cached_tokens": 0, "reason": f"{h} ids fill no whole block of {b.block}"}
        return None
    b.request(rec, f"{CROSS}:writer", other_tail(prefix, shared), (), 1, stop=False)
    d = b.request(rec, CROSS, prefix[:-1], prefix[-1:], budget, reset=False)
    state = b.be.read(d.blocks, h)
    tokens, rows = stopped(b.dec.stop, d.tokens[1:], d.rows[1:])
    cont = b.labelled(rec, tokens, b.kv.fingerprint(state), logits_fp(rows), margins(rows),
                      prefix[len(rec.prompt_ids):])
    rec.constructions[CROSS] = replace(cont, reused=d.cached)
    return state
