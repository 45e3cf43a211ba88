"""One cell on vLLM: the same :class:`~pytest_kvaudit.core.model.records.CellRecord` the claims read, built from requests.

Each construction is one request on a cold prefix cache (``reset_prefix_cache()`` first, so a unit never
depends on what the worker served before) whose K/V over ``prefix[:-1]`` are read from its blocks as it
finishes (:meth:`pytest_kvaudit.core.runtime.backends.vllm.VllmBackend.read`), and whose continuation starts from ``prefix[-1]``:

- ``live``: the request that generated the trajectory; its suffix is its own tokens after the boundary;
- ``incremental`` (the bridge): the prompt, then ``prefix[len(prompt):]`` *teacher-forced* as decode steps,
  then free decoding: the live request's schedule over the recorded ids;
- ``prefill`` (cold): ``prefix[:-1]`` at once, ``prefix[-1]`` forced as a decode step; ``num_cached_tokens == 0``;
- ``warm``: ``prefix`` requested right after ``live``, hitting the blocks the live request wrote while
  decoding; ``num_cached_tokens`` is the proof (``reused``; 0 is counted ``warm_cold``, never a hit);
- ``chunked(c)``: ``prefill`` under a scheduler token budget of ``c`` (the prefill steps are the proof);
- ``batched(B)``: ``prefill`` served in one call with ``B`` other requests (the step's request count is the proof);
- the 2x2's ``fixed:replay`` and ``fixed:prefill`` are ``incremental`` and ``prefill`` on the fixed ids.

vLLM reuses whole blocks only and always computes a prompt's last token, so the boundary moves to the last
position at or before the marker's where ``len(prefix) - 1`` is a multiple of the block size (after it only
for a prompt shorter than a block; the marker's is recorded): moving it later would eat the suffix of a short
answer (measured: 7 of 8 SmolLM2 chat units lost their suffix): then ``warm`` reuses the whole ``prefix[:-1]`` and computes ``prefix[-1]`` alone, and a transplant
overwrites whole cached blocks. A transplant writes the composed state into the cached blocks of ``prefix``
and continues warm (:meth:`VllmCellBuilder.continue_warm`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from pytest_kvaudit.core.compute.cells import CellBuilder, prompt_ids, surely_too_long
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.digests import fingerprint_ids
from pytest_kvaudit.core.model.items import Item, find_boundary
from pytest_kvaudit.core.model.pipeline import FIXED, LIVE_REPLICA, constructions, replicates
from pytest_kvaudit.core.model.records import DONOR, IDENTICAL, SHAM, TOO_LONG, CellRecord, Continuation, Transplant
from pytest_kvaudit.core.runtime.backends import vllm_state as vs
from pytest_kvaudit.core.runtime.state.tensors import digest

WARM = "warm"
#: the constructions a vLLM cell builds (besides live and warm), as name prefixes
REQUESTS = ("prefill", "incremental", "chunked(", "batched(")


def aligned(prompt_len: int, boundary: int, block: int) -> int:
    """The boundary whose ``prefix[:-1]`` fills whole blocks: the last one at or before ``boundary`` (the suffix
    keeps its budget and the marker), else the first one after it (a prompt shorter than a block)."""
    back = boundary - (prompt_len + boundary - 1) % block
    return back if back >= 1 else boundary + (1 - prompt_len - boundary) % block


def logits_fp(rows: Sequence[Sequence[tuple[int, float]]]) -> str:
    """Digest of the top-k (id, raw logit) of every step: vLLM hands out no full logits vector."""
    import struct

    h = digest(b"vllm-topk")
    for row in rows:
        h.update(b"|" + b"".join(struct.pack("<if", t, v) for t, v in row))
    return str(h.hexdigest())


def margins(rows: Sequence[Sequence[tuple[int, float]]]) -> list[float]:
    return [row[0][1] - row[1][1] if len(row) > 1 else 0.0 for row in rows]


def perturbed(fault: Callable[[Any, str], None], state: Any, path: str) -> Any:
    """``state`` after the state fault hook perturbed it in place (at ``path``)."""
    fault(state, path)
    return state


def stopped(stop: Callable[[Sequence[int]], bool] | None, tokens: Sequence[int],
            rows: Sequence[Any]) -> tuple[tuple[int, ...], list[Any]]:
    """A suffix (and its rows) as the item set's stop rule ends it (:func:`pytest_kvaudit.core.model.items.stopper`): vLLM decodes to
    the budget, and the tokens past the first match are dropped, so the suffix is what a stopped decoder writes."""
    k = next((k for k in range(1, len(tokens) + 1) if stop is not None and stop(tokens[:k])), len(tokens))
    return tuple(tokens[:k]), list(rows[:k])


def ineligible(gen: Sequence[int], b: int | None, max_new: int, eos: Collection[int]) -> str | None:
    """Why a trajectory with (block-aligned) boundary ``b`` has no unit, or None when it has one."""
    if b is None:
        return "boundary_not_reached"
    if b > len(gen) or b >= max_new:
        return "boundary_at_eos" if b <= len(gen) and gen[b - 1] in eos else "no_suffix_budget"
    return "boundary_at_eos" if gen[b - 1] in eos else None


def request_shape(name: str, prompt: Sequence[int], prefix: Sequence[int]) -> tuple[list[int], list[int], int | None, int, bool]:
    """The request that builds construction ``name`` over ``prefix[:-1]``: its prompt, the ids it forces as
    decode steps, the scheduler's token budget (``chunked(c)``), the other requests beside it (``batched(B)``),
    and whether it must hit nothing (every cold construction)."""
    base = name.split(":")[-1] if name.startswith("fixed:") else name.removesuffix(":replica")
    if base in ("incremental", "replay"):
        first, force = list(prompt), list(prefix[len(prompt):])
    else:
        first, force = list(prefix[:-1]), [prefix[-1]]
    tokens = int(base[8:-1]) if base.startswith("chunked(") else None
    others = int(base[8:-1]) if base.startswith("batched(") else 0
    return first, force, tokens, others, base in ("prefill", "replay") or bool(tokens) or bool(others)


def anatomy(rec: CellRecord, states: dict[str, Any], decode: Callable[[Sequence[int]], str]) -> None:
    """The cell's divergence anatomy: per-layer drift of live vs cold, and where warm and live first differ
    from cold (layer, position, ULPs)."""
    layers = vs.compare(states["live"], states["prefill"])
    c = rec.comparison
    c.drift = [[x.layer, x.keys_max_abs, x.values_max_abs, x.keys_rel, x.values_rel] for x in layers]
    c.differing_layers = [x.layer for x in layers if not x.equal]
    c.identical_layers = [x.layer for x in layers if x.equal]
    # warm's blocks are the live request's, written by decode; cold's (prefill's) by one prefill
    c.first_difference = {"warm_vs_cold": vs.first_difference(states[WARM], states["prefill"]),
                          "live_vs_cold": vs.first_difference(states["live"], states["prefill"])}
    live, pre = rec.constructions["live"].suffix, rec.constructions["prefill"].suffix
    j = next((i for i, (x, y) in enumerate(zip(live, pre)) if x != y), None)
    if j is not None:
        c.divergence_text = [decode([live[j]]), decode([pre[j]])]


def transplant_plan(identical_layers: Sequence[int]) -> list[tuple[str, str, str, tuple[int, ...] | None, str]]:
    """``(kind, donor, receiver, layers, path)`` of each transplant a divergent vLLM cell runs: both donors,
    both shams, and the identical layers alone where some are."""
    plan: list[tuple[str, str, str, tuple[int, ...] | None]] = [(DONOR, d, r, None) for d, r in (("live", "prefill"), ("prefill", "live"))]
    plan += [(SHAM, n, n, None) for n in ("prefill", "live")]
    if identical_layers:
        plan += [(IDENTICAL, d, r, tuple(identical_layers)) for d, r in (("live", "prefill"), ("prefill", "live"))]
    return [(kind, d, r, layers, f"transplant:{d}_to_{r}" if kind == DONOR else (
        f"transplant:sham:{r}" if kind == SHAM else f"transplant:{kind}:{d}_to_{r}")) for kind, d, r, layers in plan]


class VllmCellBuilder(CellBuilder):
    """A cell computed from vLLM requests (:mod:`pytest_kvaudit.core.compute.vllm_cells`)."""

    def __init__(self, dec: Any, tokenizer: Any, cfg: Any, item_set: Any,
                 transplant: Callable[[Any, Any, Any, str], Any] | None = None, max_positions: int | None = None) -> None:
        super().__init__(dec, tokenizer, cfg, item_set, transplant or vs.transplant, max_positions)
        self.be = dec.backend
        self.block = self.be.block_size

    def request(self, rec: CellRecord, name: str, first: Sequence[int], force: Sequence[int], budget: int,
                reset: bool = True, others: int = 0, tokens: int | None = None) -> Any:
        """One request (``others`` more beside it), counted in the cost; its proof is kept on the record."""
        if reset:
            self.be.reset()
        rows = [(list(first), len(force) + budget, list(force))]
        rows += [(list(first[k:]) + list(first[:k]), len(force) + budget, list(force)) for k in range(1, others + 1)]
        done = self.be.run(rows, tokens)
        for d in done:
            self.cost.forward_calls += len(d.steps)
            self.cost.forward_tokens += d.prompt_len - d.cached + max(len(d.tokens) - 1, 0)
        d = done[0]
        if tuple(d.tokens[: len(force)]) != tuple(force):
            raise KvauditError(f"vllm: the forced ids of {name} were not taken (the logits processor did not run)")
        rec.requests[name] = {"prompt": d.prompt_len, "forced": len(force), "num_cached_tokens": d.cached,
                              "prefill_chunks": d.prefill_chunks, "prefill_batch": d.prefill_batch}
        return d

    # -- the cell ------------------------------------------------------------------------------
    def compute(self, item: Item, dtype: str, fixed_prefix: tuple[int, ...] | None,
                grant: Callable[[], tuple[bool, ...]]) -> tuple[CellRecord, tuple[int, ...] | None]:
        rule = BoundaryRule.parse(item.boundary or self.item_set.boundary)
        max_new = self.item_set.max_new_tokens
        if surely_too_long(item, self.per_token, self.max_positions):
            return CellRecord(item.id, dtype, (), (), None, TOO_LONG, item.answer), None
        prompt = prompt_ids(item, self.tok, self.cfg.chat_template, self.cfg.model)
        if self.max_positions is not None and len(prompt) + max_new > self.max_positions:
            return CellRecord(item.id, dtype, prompt, (), None, TOO_LONG, item.answer), None
        rec, live, live_state = self.trajectory_(item, dtype, prompt, rule)
        primary = dtype == self.cfg.primary_dtype
        if rec.reason is not None:
            if not primary:
                self.fixed_prefix(rec, prompt, fixed_prefix)
            return rec, None
        prefix, b = rec.prefix, rec.boundary
        assert b is not None
        budget = max_new - b
        states = {"live": live_state, WARM: self.warm(rec, prefix, budget, live, live_state)}
        if replicates(self.cfg, index := self.index.get(item.id)):
            self.replica(rec, prompt, rule, b)
        for name in (s.name for s in constructions(self.cfg, index) if s.name != WARM):  # as the plan priced them
            if not name.startswith(REQUESTS):
                raise KvauditError(f"--kvaudit-backend=vllm builds {', '.join(REQUESTS)}: a registered schedule "
                                   f"({name}) is a chunk schedule of forwards, which vLLM cannot run")
            cont, state = self.forced(rec, name, prompt, prefix, budget)
            rec.constructions[name] = cont
            if name == "incremental":  # the bridge: every layer's K/V as the live request wrote them
                rec.comparison.bridge_mismatch += _mismatch(state, live_state)
            states.setdefault(name, state)
        self.fixed_prefix(rec, prompt, prefix if primary else fixed_prefix)
        anatomy(rec, states, self.decode)
        if rec.constructions["live"].suffix != rec.constructions["prefill"].suffix and grant()[0]:
            transplants(self, rec, states["live"], states["prefill"], prefix, budget)
        return rec, prefix

    def trajectory_(self, item: Item, dtype: str, prompt: tuple[int, ...], rule: BoundaryRule) -> tuple[CellRecord, Any, Any]:
        max_new = self.item_set.max_new_tokens
        d = self.request(CellRecord(item.id, dtype, prompt, (), None, None, item.answer), "live", prompt, (), max_new)
        gen, rows = d.tokens, d.rows
        marker = find_boundary(gen, rule, self.decode)
        b = None if marker is None else aligned(len(prompt), marker, self.block)
        if b is not None and b < len(gen):
            suffix, tail = stopped(self.dec.stop, gen[b:], rows[b:])
            gen, rows = gen[:b] + suffix, list(rows[:b]) + tail
        reason = ineligible(gen, b, max_new, self.dec.eos_ids)
        rec = CellRecord(item.id, dtype, prompt, gen, b if reason is None else marker, reason, item.answer)
        rec.requests["live"] = {"prompt": len(prompt), "forced": 0, "num_cached_tokens": d.cached,
                                "marker_boundary": marker, "boundary": b}
        if reason is not None:
            return rec, d, None
        assert b is not None
        state = self.be.read(d.blocks, len(prompt) + b - 1)
        if self.layer_kinds is None:
            self.layer_kinds = ["full"] * len(state.layers)
        rec.constructions["live"] = self.labelled(rec, gen[b:], vs.fingerprint(state), logits_fp(rows[b:]),
                                                  margins(rows[b:]), gen[:b])
        return rec, d, state

    def warm(self, rec: CellRecord, prefix: tuple[int, ...], budget: int, live: Any, live_state: Any) -> Any:
        """``prefix`` on the blocks the live request left cached; they must be the live request's bits."""
        h = len(prefix) - 1
        if self.dec.faults.state is not None:  # a fault may perturb the cached blocks before the hit
            self.be.write(live.blocks, perturbed(self.dec.faults.state, self.be.read(live.blocks, h), WARM))
        d = self.request(rec, WARM, prefix, (), budget, reset=False)
        state = self.be.read(d.blocks, h)
        rec.comparison.bridge_mismatch += [f"{WARM}:{m}" for m in _mismatch(state, live_state)]
        tokens, rows = stopped(self.dec.stop, d.tokens, d.rows)
        cont = self.labelled(rec, tokens, vs.fingerprint(state), logits_fp(rows), margins(rows), prefix[len(rec.prompt_ids):])
        rec.constructions[WARM] = replace(cont, reused=d.cached)
        return state

    def replica(self, rec: CellRecord, prompt: tuple[int, ...], rule: BoundaryRule, boundary: int | None) -> None:
        d = self.request(rec, LIVE_REPLICA.name, prompt, (), self.item_set.max_new_tokens)
        b = boundary or 0
        if d.tokens[:b] == rec.generated[:b] and len(d.tokens) > b:
            state = self.be.read(d.blocks, len(prompt) + b - 1)
            suffix, rows = stopped(self.dec.stop, d.tokens[b:], d.rows[b:])
            c = self.labelled(rec, suffix, vs.fingerprint(state), logits_fp(rows), (), d.tokens[:b])
        else:  # the replica's generation parted before the boundary: recorded whole, with no logits
            c = Continuation(d.tokens, "", "", None, False)
        rec.constructions[LIVE_REPLICA.name] = c

    def forced(self, rec: CellRecord, name: str, prompt: Sequence[int], prefix: Sequence[int], budget: int) -> tuple[Continuation, Any]:
        """A construction over ``prefix[:-1]`` whose continuation starts with ``prefix[-1]`` as a decode step."""
        first, force, chunk, others, cold = request_shape(name, prompt, prefix)
        d = self.request(rec, name, first, force, budget, tokens=chunk, others=others)
        if cold and d.cached:
            raise KvauditError(f"vllm: {name} hit {d.cached} cached tokens after reset_prefix_cache()")
        n = len(force)
        state = self.be.read(d.blocks, len(prefix) - 1)
        tokens, rows = d.tokens[n:], d.rows[n:]
        if self.dec.faults.state is not None:  # a fault on this state: its blocks perturbed, then continued warm
            before = vs.fingerprint(state)
            self.dec.faults.state(state, name)
            if vs.fingerprint(state) != before:
                d = self.continue_warm(rec, f"{name}:faulted", state, prefix, budget)
                tokens, rows = d.tokens, d.rows
        tokens, rows = stopped(self.dec.stop, tokens, rows)
        cont = self.labelled(rec, tokens, vs.fingerprint(state), logits_fp(rows), margins(rows), list(prefix[len(prompt):]))
        return cont, state

    def fixed_prefix(self, rec: CellRecord, prompt: tuple[int, ...], fixed: tuple[int, ...] | None) -> None:
        if fixed is None:
            return

        rec.fixed_prefix_fp, rec.fixed_prefix_len = fingerprint_ids(fixed), len(fixed)
        budget = self.item_set.max_new_tokens - (len(fixed) - len(prompt))
        if budget > 0 and len(fixed) >= 2:
            rec.fixed = {s.name.split(":")[1]: self.forced(rec, s.name, prompt, fixed, budget)[0] for s in FIXED}

    # -- the transplants ------------------------------------------------------------------------
    def continue_warm(self, rec: CellRecord, path: str, state: Any, prefix: Sequence[int], budget: int) -> Any:
        """Write ``state`` into the cached blocks of ``prefix`` and continue warm from them."""
        h = len(prefix) - 1
        seed = self.request(rec, f"{path}:blocks", prefix, (), 1)
        self.be.write(seed.blocks, state)
        d = self.request(rec, path, prefix, (), budget, reset=False)
        if d.cached != h:
            raise KvauditError(f"vllm: {path} reused {d.cached} tokens of the transplanted {h}")
        return d


def transplants(b: VllmCellBuilder, rec: CellRecord, live: Any, prefill: Any, prefix: Sequence[int], budget: int) -> None:
    """Each planned transplant (:func:`transplant_plan`) written into the cached blocks of ``prefix`` and
    continued warm; its suffix set against the donor's and the receiver's own."""
    states = {"live": live, "prefill": prefill}
    for kind, donor, receiver, layers, path in transplant_plan(rec.comparison.identical_layers):
        composed = b.transplant_fn(states[receiver], states[donor], layers, "kv")
        d = b.continue_warm(rec, path, composed, prefix, budget)
        suffix, rows = stopped(b.dec.stop, d.tokens, d.rows)
        m = margins(rows)
        target, own = rec.constructions[donor].suffix, rec.constructions[receiver].suffix
        rec.transplants.append(Transplant(f"{donor}_to_{receiver}", layers, "kv", suffix, suffix == target, kind, suffix == own,
                                          tuple(round(x, 6) for x in m), b.decode(suffix)))


def _mismatch(a: Any, b: Any) -> list[str]:
    return [f"{c.layer}:{part}" for c in vs.compare(a, b) for part, same in (("k", c.keys_equal), ("v", c.values_equal))
            if not same]
