"""The plain arithmetic of a request-level cell (:mod:`.cells`): which request builds a construction, where a
whole-block hit's boundary lies, how a suffix is cut by the stop rule, what a request cost, the price of the
requests a cell sends, and the digests of top-k logit rows. Pure functions of ids and numbers: no engine, no
torch."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from pytest_kvaudit.core.runtime.state.tensors import digest

#: the constructions a request-level cell builds as one request each (besides live and the prefix-cache hits)
REQUESTS = ("prefill", "incremental", "chunked(", "batched(")


def block_edge(prompt_len: int, boundary: int, block: int, limit: int) -> int | None:
    """The whole-block hit's boundary for an item whose own is ``boundary``: the block edge nearest it inside the
    working (``1 <= b < limit``, ``limit`` the generated tokens that leave a suffix), where ``prefix[:-1]``
    (``prompt_len + b - 1`` ids) fills whole blocks, so a hit reuses all of it and computes ``prefix[-1]`` alone:
    the last at or before ``boundary``, else the first after it. None when no edge lies inside the working. The
    item's own boundary never moves; this is an extra construction beside it."""
    back = boundary - (prompt_len + boundary - 1) % block
    if back >= 1:
        return back
    ahead = back + block
    return ahead if ahead < limit else None


def cacheable(ids: int, block: int) -> int:
    """Tokens of a ``ids``-long prompt a prefix-cache hit can cover: whole blocks, and never the last token
    (a paged engine always computes a prompt's last token)."""
    return (max(ids - 1, 0) // block) * block


def logits_fp(rows: Sequence[Sequence[tuple[int, float]]]) -> str:
    """Digest of the top-k (id, raw logit) of every step: a serving engine hands out no full logits vector."""
    import struct

    h = digest(b"vllm-topk")  # its first engine's tag, kept: the ledgers' fingerprints hold it
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
    """A suffix (and its rows) as the item set's stop rule ends it (:func:`pytest_kvaudit.core.model.items.stopper`):
    the engine decodes to the budget, and the tokens past the first match are dropped, so the suffix is what a stopped
    decoder writes."""
    k = next((k for k in range(1, len(tokens) + 1) if stop is not None and stop(tokens[:k])), len(tokens))
    return tuple(tokens[:k]), list(rows[:k])


def ineligible(gen: Sequence[int], b: int | None, max_new: int, eos: Collection[int]) -> str | None:
    """Why a trajectory with boundary ``b`` has no unit, or None when it has one."""
    if b is None:
        return "boundary_not_reached"
    if b > len(gen) or b >= max_new:
        return "boundary_at_eos" if b <= len(gen) and gen[b - 1] in eos else "no_suffix_budget"
    return "boundary_at_eos" if gen[b - 1] in eos else None


def request_shape(name: str, prompt: Sequence[int],
                  prefix: Sequence[int]) -> tuple[list[int], list[int], int | None, int, bool]:
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


def other_tail(prefix: Sequence[int], shared: int) -> list[int]:
    """The prompt of another request sharing ``prefix``'s first ``shared`` ids (whole blocks) and nothing after:
    those ids, then the next id changed (a different question after a shared system prompt)."""
    nxt = prefix[shared] if shared < len(prefix) else 0
    return [*prefix[:shared], nxt + 1 if nxt > 0 else 1]


def request_price(name: str, prompt: int, head: int, suffix: int, budget: int, block: int) -> tuple[int, int] | None:
    """The plan's price (calls, tokens) of a request-level step that is not the pipeline's forward model, on blocks
    of ``block`` tokens, from the requests :class:`.cells.RequestCellBuilder` sends (``head`` ids before the
    prefix's last, ``suffix`` decode steps, ``budget`` what a request may decode); None for a step priced as
    declared (``prefill``, ``incremental``, ``chunked(c)`` and the 2x2's cells cost what their forwards do):

    - ``warm``: the partial hit (its tail after the last whole block prefilled), the whole-block hit (the ids
      between its block edge and the boundary, decoded), the request that writes the cross-request hit's
      blocks and the cross-request hit itself;
    - ``batched(B)``: the unit's request and ``B`` others of its length, which decode to the budget;
    - ``transplant``: one cold request that prefills ``prefix[:-1]`` again before its continuation;
    - ``cross`` (a ledger records its continuation apart): nothing more, ``warm`` sent it."""
    tail = head - cacheable(head + 1, block)
    if name in ("cross", "warm:block"):  # sent by the warm step, in its price (a ledger records cross apart)
        return 0, 0
    if name == "warm":
        return 3 * (1 + suffix) + 1 + tail, 3 * (tail + suffix) + (head - tail) + 1
    if name.startswith("batched("):
        b = int(name[len("batched("):-1])
        return 1 + suffix + b * (1 + budget), head + suffix + b * (head + budget)
    if name == "transplant":
        return 1 + suffix, head + suffix
    return None


def stop_rule(regex: str | None, after: int | None = None, lead: Sequence[int] = (),
              rule: Any = None) -> dict[str, Any] | None:
    """The item set's stop rule (``regex``) for a request, None when it has none: its suffix starts ``after`` ids
    into the request's output behind ``lead`` (ids of the suffix already in its prompt), or where ``rule`` (a
    :class:`pytest_kvaudit.core.model.config.BoundaryRule`) finds the boundary in the output (the live request and
    its replica)."""
    if regex is None:
        return None
    if rule is not None:
        return {"regex": regex, "marker": rule.marker, "tokens": rule.tokens}
    return {"regex": regex, "after": after or 0, "lead": list(lead)}


def request_cost(done: Sequence[Any]) -> tuple[int, int]:
    """(engine steps, forward tokens) of served requests: the steps each was scheduled in, and its prompt's
    uncached ids plus every decoded token but the last (which no forward fed)."""
    return (sum(len(d.steps) for d in done),
            sum(d.prompt_len - d.cached + max(len(d.tokens) - 1, 0) for d in done))
