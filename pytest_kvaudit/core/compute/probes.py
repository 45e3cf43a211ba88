"""Probes beyond the claims, run once per precision after its cells: further attention implementations
(does their live cache equal their prefill?), further cache layouts (the static cache: live vs prefill,
the bridge and a transplant on preallocated tensors) and batch invariance (is a boundary state computed
inside a left-padded batch the same as computed alone?). Their outcomes land in each record's ``probes``,
each with the forward ``tokens`` it ran (so a plan can be checked against the records, token for token)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from pytest_kvaudit.core.compute.cells import chars_per_token, prompt_ids, surely_too_long
from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.model.cache_kinds import OFFLOADED, is_lossy, offload_not_meaningful
from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule
from pytest_kvaudit.core.model.engine_protocol import Backend
from pytest_kvaudit.core.model.items import Item, ItemSet, extract_answer, stopper, token_text
from pytest_kvaudit.core.model.pipeline import LIVE, step_named
from pytest_kvaudit.core.model.schedules import schedule
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.core.runtime.decoder import Cost, Decoder, Faults, continue_greedy, trajectory

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.records import CellRecord


class ProbeStore(Protocol):
    """What a probe reads of the run's store (a :class:`.store.Store` is one): its settings, items, records,
    the model at a precision, where forwards are counted and faults injected, and the run's environment (where
    a probe on an engine of its own records that engine's settings)."""

    cfg: AuditConfig
    item_set: ItemSet
    items: list[Item]
    records: dict[tuple[str, str], CellRecord]
    cost: Cost
    faults: Faults
    environment: dict[str, Any]

    def handle(self, dtype: str, attn: str | None = None) -> Backend: ...


def audited(store: ProbeStore, dtype: str) -> Iterator[tuple[Item, CellRecord]]:
    """This store's items whose cell at ``dtype`` holds a boundary state to probe (under xdist, only the items
    this worker took from the queue)."""
    for item in store.items:
        rec = store.records.get((item.id, dtype))
        if rec is not None and rec.eligible and not rec.unsupported:
            yield item, rec


def attention_axis(store: ProbeStore, dtype: str, attn: str) -> None:
    """Another attention implementation on the same items: is its live cache the same as its prefill?"""
    h = store.handle(dtype, attn)
    dec = Decoder(h, h.eos_ids, store.cost, store.faults)
    iset = store.item_set
    dec.stop = stopper(iset, partial(token_text, h.tokenizer))
    for item, rec in audited(store, dtype):
        rule = BoundaryRule.parse(item.boundary or iset.boundary)
        t0 = dec.cost.forward_tokens
        dec.path = f"axis:{attn}:live"
        tr = trajectory(dec, rec.prompt_ids, iset.max_new_tokens, rule, partial(token_text, h.tokenizer))
        if tr.reason is not None:
            rec.probes.axes[attn] = {"eligible": False, "reason": tr.reason, "tokens": dec.cost.forward_tokens - t0}
            continue
        # this implementation's own trajectory fixes its prefix: live vs prefill under ``attn``
        head = list(tr.prefix[:-1])
        dec.path = f"axis:{attn}:prefill"
        state = dec.build_state(head, [len(head)])
        fp = kv.fingerprint(state)
        suffix, _ = continue_greedy(dec, state, tr.prefix[-1], iset.max_new_tokens - (tr.boundary or 0))
        rec.probes.axes[attn] = {"eligible": True, "state_equal": fp == tr.state_fp,
                                 "suffix_equal": suffix == tr.suffix,
                                 "same_trajectory_as_primary": tr.generated == rec.generated,
                                 "tokens": dec.cost.forward_tokens - t0}


def cache_probe(store: ProbeStore, h: Backend, dtype: str, kind: str) -> None:
    """The probe of one further cache kind: a lossy one against the exact cache, any other for exactness."""
    (lossy_axis if is_lossy(kind) else cache_axis)(store, h, dtype, kind)


def cache_axis(store: ProbeStore, h: Backend, dtype: str, kind: str) -> None:
    """The constructions on another cache layout (``static``: tensors preallocated to prompt + max_new_tokens
    positions, what ``torch.compile`` users run). On its own trajectory: is its prefill equal to its live
    state (replay), its token-by-token replay equal to it bit for bit (the bridge), does a prefill receiving
    the live K/V (a transplant into the preallocated slice) hold exactly the live state and follow it; and is
    its live state the dynamic layout's, bit for bit, over the filled positions."""
    iset = store.item_set
    why = offload_not_meaningful(h.device) if kind == OFFLOADED else None
    for item, rec in audited(store, dtype):
        if why is not None:  # said per unit, so the report and the claim can say it
            rec.probes.cache[kind] = {"eligible": False, "reason": why, "tokens": 0}
            continue
        rule = BoundaryRule.parse(item.boundary or iset.boundary)
        dec = Decoder(h, h.eos_ids, store.cost, store.faults, kind, len(rec.prompt_ids) + iset.max_new_tokens)
        dec.stop = stopper(iset, partial(token_text, h.tokenizer))
        t0 = dec.cost.forward_tokens
        dec.path = f"cache:{kind}:live"
        tr = trajectory(dec, rec.prompt_ids, iset.max_new_tokens, rule, partial(token_text, h.tokenizer),
                        keep_state=True)
        if tr.reason is not None:
            rec.probes.cache[kind] = {"eligible": False, "reason": tr.reason, "tokens": dec.cost.forward_tokens - t0}
            continue
        head, last = list(tr.prefix[:-1]), tr.prefix[-1]
        budget = iset.max_new_tokens - (tr.boundary or 0)
        out: dict[str, Any] = {"eligible": True,
                               "state_equals_dynamic": tr.state_fp == rec.constructions["live"].state_fp,
                               "suffix_equals_dynamic": tr.suffix == rec.constructions["live"].suffix}
        kept = None
        for name in ("prefill", "incremental"):
            dec.path = f"cache:{kind}:{name}"
            state = dec.build_state(head, schedule(name, len(rec.prompt_ids), len(head)))
            out[name] = {"state_equal": kv.fingerprint(state) == tr.state_fp}
            if name == "incremental":
                out[name]["mismatch"] = [f"{c.layer}:{p}" for c in kv.compare(state, tr.state)
                                         for p, same in (("k", c.keys_equal), ("v", c.values_equal)) if not same]
            else:
                kept = kv.clone(state)
            suffix, _ = continue_greedy(dec, state, last, budget)
            out[name]["suffix_equal"] = suffix == tr.suffix
            out[name]["suffix"] = list(suffix)
        dec.path = f"transplant:{kind}:live_to_prefill"
        moved = store.faults.transplant(kept, tr.state, None, "kv") if store.faults.transplant else kv.transplant(
            kept, tr.state)
        same = kv.fingerprint(moved) == tr.state_fp
        suffix, _ = continue_greedy(dec, moved, last, budget)
        out["transplant"] = {"state_equal": same, "followed": suffix == tr.suffix,
                             "held": suffix == tuple(out["prefill"]["suffix"])}
        out["tokens"] = dec.cost.forward_tokens - t0
        rec.probes.cache[kind] = out


def lossy_axis(store: ProbeStore, h: Backend, dtype: str, kind: str) -> None:
    """A lossy cache (``quantized:...``) against the exact one on the same ids: the prefix built in one shot
    on the lossy cache, continued, and set against the exact prefill construction's continuation (the same
    schedule on the dynamic cache), so that the cache is the only difference. Records where the suffixes part,
    the top-2 margins there and the label."""
    iset = store.item_set
    dec = Decoder(h, h.eos_ids, store.cost, store.faults, kind)
    dec.stop = stopper(iset, partial(token_text, h.tokenizer))
    for _, rec in audited(store, dtype):
        exact = rec.constructions.get("prefill")
        if exact is None or rec.boundary is None:
            continue
        t0 = dec.cost.forward_tokens
        head, last = list(rec.prefix[:-1]), rec.prefix[-1]
        dec.path = f"cache:{kind}:prefill"
        margins: list[float] = []
        suffix, _ = continue_greedy(dec, dec.build_state(head, [len(head)]), last,
                                    iset.max_new_tokens - rec.boundary, margins)
        rec.probes.cache[kind] = lossy_outcome(rec, suffix, margins, partial(token_text, h.tokenizer),
                                               iset.answer_regex, dec.cost.forward_tokens - t0)


def lossy_outcome(rec: CellRecord, suffix: Sequence[int], margins: Sequence[float], decode: Callable[[list[int]], str],
                  answer_regex: str, tokens: int) -> dict[str, Any]:
    """What a lossy cache's probe records of one unit (any engine's: :func:`lossy_axis`, vLLM's fp8 in
    :mod:`pytest_kvaudit.engines.vllm.lossy`): its ``suffix`` set against the exact prefill construction's, where
    they part, the top-2 margins there (``margins``: the lossy continuation's, per step), the answer and its
    label."""
    exact = rec.constructions["prefill"]
    got = tuple(suffix)
    ans = extract_answer(decode(list(rec.generated[: rec.boundary]) + list(got)), answer_regex)
    j = next((i for i, (x, y) in enumerate(zip(exact.suffix, got)) if x != y),
             None if len(exact.suffix) == len(got) else min(len(exact.suffix), len(got)))
    return {"eligible": True, "lossy": True, "suffix": list(got), "suffix_equal": got == exact.suffix,
            "position": j, "answer": ans, "label": ans is not None and ans == rec.answer, "exact_label": exact.label,
            "exact_extracted": exact.answer is not None,
            "margin_exact": exact.margins[j] if j is not None and j < len(exact.margins) else None,
            "margin_lossy": round(margins[j], 6) if j is not None and j < len(margins) else None,
            "tokens": tokens}


def batch_invariance(store: ProbeStore, dec: Decoder, h: Backend, dtype: str) -> None:
    """The item's boundary state computed alone vs as one row of a left-padded batch of others (one forward
    through the decoder: counted, and seen by the state fault hook at path ``batch``)."""
    b, all_items = store.cfg.batch_size, store.item_set.items
    per_token = chars_per_token(h.tokenizer) if h.max_positions is not None else None
    index = {it.id: i for i, it in enumerate(all_items)}
    for item, rec in audited(store, dtype):
        if index[item.id] >= store.cfg.batch_units or b < 2:
            continue
        head = list(rec.prefix[:-1])
        others = [o for j in range(1, b)
                  if not surely_too_long(o := all_items[(index[item.id] + j) % len(all_items)], per_token,
                                         h.max_positions)]
        other_rows = [list(prompt_ids(o, h.tokenizer, store.cfg.chat_template, store.cfg.model)) for o in others]
        rows = [head] + [r for r in other_rows if h.max_positions is None or len(r) <= h.max_positions]
        if len(rows) < 2:  # every other prompt is too long to share a batch with
            continue
        pad = h.tokenizer.pad_token_id if h.tokenizer.pad_token_id is not None else 0
        outcome: dict[str, Any]
        t0 = dec.cost.forward_tokens
        dec.path = "batch"
        try:
            cache = dec.step_batch(rows, pad)
            mine = kv.row_state(cache, 0, len(head))
            same = kv.fingerprint_tensors(mine, tag=b"kv") == rec.constructions["prefill"].state_fp
            outcome = {"batch_size": b, "state_equal": same, "tokens": dec.cost.forward_tokens - t0}
        except (RuntimeError, ValueError, IndexError, UnsupportedCacheError) as exc:  # no comparable row
            outcome = {"batch_size": b, "error": str(exc).splitlines()[0][:200], "tokens": dec.cost.forward_tokens - t0}
        rec.probes.batch = outcome


# -- the probes' prices, declared beside them: the plan iterates these (pytest_kvaudit.core.planning.unit_work) --
Price = list[tuple[int, int]]  # the (calls, tokens) of each forward run a probe makes on one unit


def attention_price(prompt: int, head: int, suffix: int, generated: int) -> Price:
    """:func:`attention_axis` on one eligible unit: its own trajectory, then a prefill over its head and the
    suffix decoded from it."""
    return [LIVE.price(prompt, generated), step_named("prefill").price(prompt, head, suffix)]


def cache_price(prompt: int, head: int, suffix: int, generated: int) -> Price:
    """:func:`cache_axis` on one eligible unit: its own trajectory, the prefill and the incremental replay with
    their suffixes, and the transplant's continuation."""
    return [LIVE.price(prompt, generated),
            *(step_named(n).price(prompt, head, suffix) for n in ("prefill", "incremental")),
            (suffix, suffix)]


def lossy_price(prompt: int, head: int, suffix: int, generated: int) -> Price:
    """:func:`lossy_axis` on one eligible unit: one prefill on the lossy cache and its continuation."""
    return [step_named("prefill").price(prompt, head, suffix)]


def cache_probe_price(kind: str) -> Callable[[int, int, int, int], Price]:
    """The price of :func:`cache_probe` for ``kind``: it runs :func:`lossy_axis` or :func:`cache_axis`."""
    return lossy_price if is_lossy(kind) else cache_price


def batch_price(cfg: AuditConfig, head: int, width: int) -> tuple[int, int]:
    """:func:`batch_invariance` on one unit, at most: one forward of ``batch_size`` rows left-padded to the
    widest of them (``width``: the widest prompt it may meet)."""
    return 1, cfg.batch_size * max(width, head)


def batch_tokens(head: int, index: int, prompts: Sequence[int | None], cfg: AuditConfig) -> int:
    """:func:`batch_invariance`'s tokens for the item at ``index`` of the item set, exactly: its boundary head
    and the next ``batch_size - 1`` items' prompts (None: too long to run), left-padded to one width."""
    if index >= cfg.batch_units or cfg.batch_size < 2:
        return 0
    others = [p for j in range(1, cfg.batch_size) if (p := prompts[(index + j) % len(prompts)]) is not None]
    return 0 if not others else (1 + len(others)) * max(head, *others)
