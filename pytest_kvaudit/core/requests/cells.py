"""One cell on a request-level engine (vLLM, transformers' continuous batching): the same
:class:`~pytest_kvaudit.core.model.records.CellRecord` the claims read, built from requests, in the steps
:class:`~pytest_kvaudit.core.compute.cells.CellBuilder` runs for every engine (its ``compute`` is the pipeline: too-long
checks, the trajectory, the replicas, the constructions the selected claims need, the 2x2, the anatomy, the transplants
on granted divergent units). This class only says how each step is one or more requests.

Each construction is one request on a cold prefix cache (``reset_prefix_cache()`` first, so a unit never depends on what
the worker served before) whose K/V over ``prefix[:-1]`` are read from its blocks as it finishes (the backend's
``read``: :class:`.protocol.RequestBackend`), and whose continuation starts from ``prefix[-1]``:

- ``live``: the request that generated the trajectory; its suffix is its own tokens after the boundary;
- ``incremental`` (the bridge): the prompt, then ``prefix[len(prompt):]`` *teacher-forced* as decode steps, then free
  decoding: the live request's schedule over the recorded ids;
- ``prefill`` (cold): ``prefix[:-1]`` at once, ``prefix[-1]`` forced as a decode step; ``num_cached_tokens == 0``;
- ``chunked(c)``: ``prefill`` under a scheduler token budget of ``c`` (the prefill steps are the proof);
- ``batched(B)``: ``prefill`` served in one call with ``B`` other requests (the step's request count is the proof);
- the prefix cache's three hit shapes (:mod:`.hits`): ``warm`` (partial, at the item's boundary),
  ``requests["warm:block"]`` (whole-block, at the nearest block edge inside the working) and ``cross``;
- the 2x2's ``fixed:replay`` and ``fixed:prefill`` are ``incremental`` and ``prefill`` on the fixed ids.

The boundary is the item's own (the marker's): no unit is moved to suit the block size."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_kvaudit.core.compute.cells import CellBuilder
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.digests import fingerprint_ids
from pytest_kvaudit.core.model.items import Item, find_boundary
from pytest_kvaudit.core.model.pipeline import FIXED, LIVE_REPLICA, constructions
from pytest_kvaudit.core.model.records import TAIL_CHARS, TAIL_TOKENS, CellRecord, Continuation
from pytest_kvaudit.core.requests import hits
from pytest_kvaudit.core.requests import transplants as vt
from pytest_kvaudit.core.requests.arithmetic import (
    REQUESTS,
    ineligible,
    logits_fp,
    margins,
    request_cost,
    request_shape,
    stop_rule,
    stopped,
)

__all__ = ["REQUESTS", "RequestCellBuilder", "stopped"]
WARM = hits.WARM


@dataclass
class Live:
    """The live request as the pipeline reads a trajectory: why it has no unit, its boundary, prefix and state."""

    reason: str | None
    boundary: int | None
    prefix: tuple[int, ...]
    state: Any
    done: Any


class RequestCellBuilder(CellBuilder):
    """A cell computed from an engine's requests (:mod:`pytest_kvaudit.core.requests.cells`): its backend is a
    :class:`.protocol.RequestBackend`, its record's state reader reads what ``read`` returns."""

    def __init__(self, dec: Any, tokenizer: Any, cfg: Any, item_set: Any,
                 transplant: Callable[[Any, Any, Any, str], Any] | None = None,
                 max_positions: int | None = None) -> None:
        super().__init__(dec, tokenizer, cfg, item_set, transplant, max_positions)
        self.be = dec.backend
        self.block = self.be.block_size
        self.live: Live | None = None
        self.states: dict[str, Any] = {}

    def stop_rule(self, after: int | None = None, lead: Sequence[int] = (),
                  rule: BoundaryRule | None = None) -> dict[str, Any] | None:
        """The item set's stop rule for a request (:func:`.arithmetic.stop_rule`)."""
        return stop_rule(self.item_set.stop_regex, after, lead, rule)

    def request(self, rec: CellRecord, name: str, first: Sequence[int], force: Sequence[int], budget: int,
                reset: bool = True, others: int = 0, tokens: int | None = None,
                stop: dict[str, Any] | None | bool = True) -> Any:
        """One request (``others`` more beside it), counted in the cost; its proof is kept on the record. It
        stops where the item set's stop rule ends its suffix (``stop``; by default the suffix follows the forced
        ids), as a transformers decoder does; the ``others`` of ``batched(B)`` decode to the budget, so the
        batch around it is the one it always had."""
        if reset:
            self.be.reset()
        rule = self.stop_rule(len(force)) if stop is True else (stop or None)
        rows = [(list(first), len(force) + budget, list(force), rule)]
        rows += [(list(first[k:]) + list(first[:k]), len(force) + budget, list(force), None)
                 for k in range(1, others + 1)]
        done = self.be.run(rows, tokens)
        calls, spent = request_cost(done)
        self.cost.forward_calls += calls
        self.cost.forward_tokens += spent
        d = done[0]
        if tuple(d.tokens[: len(force)]) != tuple(force):
            raise KvauditError(f"{self.engine.name}: the forced ids of {name} were not taken (the logits processor did "
                               "not run)")
        # what the engine computed for it, the batch's others included: the run's price is its records' sum
        was = rec.requests.get(name, {}).get("cost", (0, 0))
        rec.requests[name] = {"prompt": d.prompt_len, "forced": len(force), "num_cached_tokens": d.cached,
                              "prefill_chunks": d.prefill_chunks, "prefill_batch": d.prefill_batch,
                              "cost": [was[0] + calls, was[1] + spent]}
        return d

    # -- the pipeline's steps, as requests --------------------------------------------------------
    def trajectory(self, item: Item, dtype: str, prompt: tuple[int, ...], rule: BoundaryRule) -> tuple[CellRecord, Any]:
        max_new = self.item_set.max_new_tokens
        self.states = {}
        first = CellRecord(item.id, dtype, prompt, (), None, None, item.answer)
        d = self.request(first, "live", prompt, (), max_new, stop=self.stop_rule(rule=rule))
        gen, rows = d.tokens, d.rows
        b = find_boundary(gen, rule, self.decode)
        if b is not None and b < len(gen):
            suffix, tail = stopped(self.dec.stop, gen[b:], rows[b:])
            gen, rows = gen[:b] + suffix, list(rows[:b]) + tail
        reason = ineligible(gen, b, max_new, self.dec.eos_ids)
        rec = CellRecord(item.id, dtype, prompt, gen, b, reason, item.answer)
        rec.requests["live"] = {"prompt": len(prompt), "forced": 0, "num_cached_tokens": d.cached, "boundary": b,
                                "cost": first.requests["live"]["cost"]}
        if reason is not None:
            if b is None:
                rec.generated_tail = self.decode(gen[-TAIL_TOKENS:])[-TAIL_CHARS:]
            self.live = Live(reason, b, (), None, d)
            return rec, self.live
        assert b is not None
        state = self.be.read(d.blocks, len(prompt) + b - 1)
        if self.layer_kinds is None:
            self.layer_kinds = ["full"] * len(state.layers)
        rec.constructions["live"] = self.labelled(rec, gen[b:], self.kv.fingerprint(state), logits_fp(rows[b:]),
                                                  margins(rows[b:]), gen[:b])
        self.live = Live(None, b, tuple(prompt) + tuple(gen[:b]), state, d)
        self.states["live"] = state
        if self.cfg.computes(WARM):  # the hits on the live request's own blocks: before any other request resets them
            self.states[WARM] = hits.partial(self, rec, self.live.prefix, max_new - b, d, state)
            hits.whole_block(self, rec, d, max_new)
        return rec, self.live

    def replica(self, rec: CellRecord, prompt: tuple[int, ...], rule: BoundaryRule, boundary: int | None) -> None:
        d = self.request(rec, LIVE_REPLICA.name, prompt, (), self.item_set.max_new_tokens,
                         stop=self.stop_rule(rule=rule))
        b = boundary or 0
        if d.tokens[:b] == rec.generated[:b] and len(d.tokens) > b:
            state = self.be.read(d.blocks, len(prompt) + b - 1)
            suffix, rows = stopped(self.dec.stop, d.tokens[b:], d.rows[b:])
            c = self.labelled(rec, suffix, self.kv.fingerprint(state), logits_fp(rows), (), d.tokens[:b])
        else:  # the replica's generation parted before the boundary: recorded whole, with no logits
            c = Continuation(d.tokens, "", "", None, False)
        rec.constructions[LIVE_REPLICA.name] = c

    def constructions(self, rec: CellRecord, prompt: tuple[int, ...], head: list[int], last: int, budget: int,
                      live_state: Any, index: int | None = None) -> Any:
        """Every construction the pipeline declares for this item (as the plan priced them); ``warm`` (its partial
        and whole-block hits run in :meth:`trajectory`, on the live request's blocks before anything resets
        them) brings the cross-request hit. Returns prefill's state (the anatomy and transplants')."""
        assert self.live is not None
        prefix = self.live.prefix
        for step in constructions(self.cfg, index):
            if step.name == WARM:  # partial and whole-block ran beside the trajectory; cross writes its own blocks
                self.states["cross"] = hits.cross(self, rec, prefix, budget)
                continue
            cont, state = self.forced(rec, step.name, prompt, prefix, budget)
            rec.constructions[step.name] = cont
            if step.bridge:  # the bridge: every layer's K/V as the live request wrote them
                rec.comparison.bridge_mismatch += _mismatch(self.kv, state, live_state)
            self.states.setdefault(step.name, state)
        return self.states["prefill"]

    def forced(self, rec: CellRecord, name: str, prompt: Sequence[int], prefix: Sequence[int],
               budget: int) -> tuple[Continuation, Any]:
        """A construction over ``prefix[:-1]`` whose continuation starts with ``prefix[-1]`` as a decode step."""
        if not name.startswith(REQUESTS) and not name.startswith("fixed:"):
            raise KvauditError(f"--kvaudit-backend={self.engine.name} builds {', '.join(REQUESTS)}: {name} is a chunk "
                               "schedule of forwards, which it cannot run")
        first, force, chunk, others, cold = request_shape(name, prompt, prefix)
        d = self.request(rec, name, first, force, budget, tokens=chunk, others=others)
        if cold and d.cached:
            raise KvauditError(f"{self.engine.name}: {name} hit {d.cached} cached tokens after reset_prefix_cache()")
        n = len(force)
        state = self.be.read(d.blocks, len(prefix) - 1)
        tokens, rows = d.tokens[n:], d.rows[n:]
        if self.dec.faults.state is not None:  # a fault on this state: its blocks perturbed, then continued warm
            before = self.kv.fingerprint(state)
            self.dec.faults.state(state, name)
            if self.kv.fingerprint(state) != before:
                d = vt.continue_warm(self, rec, f"{name}:faulted", state, prefix, budget)
                tokens, rows = d.tokens, d.rows
        tokens, rows = stopped(self.dec.stop, tokens, rows)
        cont = self.labelled(rec, tokens, self.kv.fingerprint(state), logits_fp(rows), margins(rows),
                             list(prefix[len(prompt):]))
        return cont, state

    def fixed_prefix(self, rec: CellRecord, prompt: tuple[int, ...], fixed: tuple[int, ...] | None) -> None:
        if fixed is None:
            return
        rec.fixed_prefix_fp, rec.fixed_prefix_len = fingerprint_ids(fixed), len(fixed)
        budget = self.item_set.max_new_tokens - (len(fixed) - len(prompt))
        if budget > 0 and len(fixed) >= 2:
            rec.fixed = {s.name.split(":")[1]: self.forced(rec, s.name, prompt, fixed, budget)[0] for s in FIXED}

    def anatomy(self, rec: CellRecord, live_state: Any, prefill_state: Any) -> None:
        vt.anatomy(rec, self.states, self.decode, self.kv)

    def transplants(self, rec: CellRecord, live_state: Any, prefill_state: Any, last: int, budget: int,
                    sweep: bool) -> None:
        assert self.live is not None
        vt.transplants(self, rec, live_state, prefill_state, self.live.prefix, budget, self.cfg.computes("controls"))


def _mismatch(kv: Any, a: Any, b: Any) -> list[str]:
    return [f"{c.layer}:{part}" for c in kv.compare(a, b) for part, same in (("k", c.keys_equal), ("v", c.values_equal))
            if not same]
