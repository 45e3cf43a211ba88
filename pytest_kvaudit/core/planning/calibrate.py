"""The plan's calibration: a few real forwards at each precision, timed, and the first items' lengths, so
that the plan can price the run in seconds and expect its lengths (:mod:`.plan`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.compute.cells import prompt_ids
from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import extract_answer, stopper, token_text
from pytest_kvaudit.core.runtime.decoder import Cost, Decoder, continue_greedy, trajectory

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.store import Store

#: items per precision the calibration runs
SAMPLE = 8


def calibrate(store: Store, sample: int = SAMPLE) -> dict[str, Any]:
    """Per precision: the model's load time, a per-call and a per-token forward cost, and the first ``sample``
    items' lengths (trajectory, then a prefill to see whether the item diverges), timed by the engine's
    calibrator (:attr:`EngineSpec.calibrator`; :func:`forward_calibration` for a forward-level engine). The
    precisions run last to first, so the model the store computes first stays loaded. Counted apart from the
    store's cost."""
    cfg, iset = store.cfg, store.item_set
    timer = cfg.engine.calibrator
    out: dict[str, Any] = {"sample": sample, "dtypes": {}}
    t_all = time.perf_counter()
    tokens = 0
    for dtype in reversed(cfg.dtypes):
        t0 = time.perf_counter()
        h = store.handle(dtype)
        load_s = time.perf_counter() - t0
        cost = Cost()
        items = [it for it in store.items if it.prompt_ids is not None or it.prompt is not None][:sample]
        prompts = [prompt_ids(it, h.tokenizer, cfg.chat_template, cfg.model) for it in items]
        out["dtypes"][dtype] = {"load_s": round(load_s, 4), **timer(h, items, prompts, iset, cost)}
        tokens += cost.forward_tokens
    out["seconds"] = round(time.perf_counter() - t_all, 3)
    out["forward_tokens"] = tokens
    return out


def forward_calibration(h: Any, items: Sequence[Any], prompts: Sequence[Sequence[int]], iset: Any,
                        cost: Cost) -> dict[str, Any]:
    """A forward-level engine's calibration: each item's prompt forward and its trajectory's one-token steps,
    timed, then a prefill of its prefix to see whether it diverges."""
    import torch

    def sync(dev: Any) -> None:
        if getattr(dev, "type", "") == "cuda":
            torch.cuda.synchronize(dev)

    dec = Decoder(h, h.eos_ids, cost)
    dec.stop = stopper(iset, partial(token_text, h.tokenizer))
    if prompts:  # one untimed forward: one-time kernel set-up is not a per-call cost
        dec.step(list(prompts[0]), dec.fresh())
    rows: list[dict[str, Any]] = []
    t_prompt = t_decode = 0.0
    n_prompt = n_decode = 0
    for it, ids in zip(items, prompts):
        if h.max_positions is not None and len(ids) + iset.max_new_tokens > h.max_positions:
            continue
        sync(dec.device)
        t1 = time.perf_counter()
        dec.step(list(ids), dec.fresh())
        sync(dec.device)
        t_prompt += time.perf_counter() - t1
        n_prompt += len(ids)
        t_p = time.perf_counter() - t1
        calls0 = cost.forward_calls
        t2 = time.perf_counter()
        tr = trajectory(dec, ids, iset.max_new_tokens, BoundaryRule.parse(it.boundary or iset.boundary),
                        partial(token_text, h.tokenizer))
        sync(dec.device)
        # the trajectory's own prompt forward is charged at the prompt time just measured
        t_decode += max(0.0, time.perf_counter() - t2 - t_p)
        n_decode += cost.forward_calls - calls0 - 1
        row: dict[str, Any] = {"prompt": len(ids), "generated": len(tr.generated), "boundary": tr.boundary or 0,
               "eligible": tr.reason is None, "divergent": False}
        if tr.reason is None:
            head = list(tr.prefix[:-1])
            state = dec.build_state(head, [len(head)])
            suffix, _ = continue_greedy(dec, state, tr.prefix[-1], iset.max_new_tokens - (tr.boundary or 0))
            row["divergent"] = suffix != tr.suffix
            row["suffix"] = len(tr.suffix)
            # the labels, as the cells extract them: a model right (or wrong) on every item has labels that cannot
            # move, which the plan must see before it promises matched_construction a verdict
            gen_head = list(tr.generated[: tr.boundary or 0])
            row["right"] = [extract_answer(token_text(h.tokenizer, ids_), iset.answer_regex) == it.answer
                            for ids_ in (list(tr.generated), gen_head + list(suffix))]
        rows.append(row)
    per_call = t_decode / n_decode if n_decode else 0.0
    n_p = len(rows) or 1
    # prompt forward = per_call + per_token x P: the per-token cost is what a longer forward adds
    per_token = max(0.0, (t_prompt / n_p - per_call) / max(1.0, n_prompt / n_p - 1)) if rows else 0.0
    return {"per_call_s": per_call, "per_token_s": per_token, "items": rows, "forward_tokens": cost.forward_tokens}
