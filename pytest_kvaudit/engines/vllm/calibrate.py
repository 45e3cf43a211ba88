"""The plan's calibration on vLLM (:mod:`pytest_kvaudit.core.planning.calibrate`), in requests: vLLM runs no forward
on a caller's cache, so the per-call and per-token costs are timed from whole requests."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import find_boundary


def calibrate(be: Any, items: Sequence[Any], prompts: Sequence[Sequence[int]], item_set: Any,
              cost: Any) -> dict[str, Any]:
    """The plan's calibration in requests (:mod:`pytest_kvaudit.core.planning.calibrate`): per item a prompt-only
    request and the live one, timed (per call = a decode step, per token = what a longer prompt adds), and a cold
    prefill of its prefix (at the item's own boundary) to see whether it diverges."""
    rows: list[dict[str, Any]] = []
    t_prompt = t_decode = 0.0
    n_prompt = n_decode = 0
    for it, ids in zip(items, prompts):
        if be.max_positions is not None and len(ids) + item_set.max_new_tokens > be.max_positions:
            continue
        be.reset()
        t0 = time.perf_counter()
        be.run([(ids, 1, ())])
        t_p = time.perf_counter() - t0
        be.reset()
        (live,) = be.run([(ids, item_set.max_new_tokens, ())])
        t_decode += max(0.0, time.perf_counter() - t0 - 2 * t_p)
        t_prompt, n_prompt, n_decode = t_prompt + t_p, n_prompt + len(ids), n_decode + max(len(live.tokens) - 1, 0)
        gen = live.tokens
        b = find_boundary(gen, BoundaryRule.parse(it.boundary or item_set.boundary), be.decode)  # the item's own
        ok = b is not None and b < min(len(gen), item_set.max_new_tokens) and gen[b - 1] not in be.eos_ids
        row = {"prompt": len(ids), "generated": len(gen), "boundary": b or 0, "eligible": ok, "divergent": False}
        if ok and b is not None:
            prefix = list(ids) + list(gen[:b])
            be.reset()
            (cold,) = be.run([(prefix[:-1], 1 + item_set.max_new_tokens - b, prefix[-1:])])
            row["divergent"], row["suffix"] = cold.tokens[1:] != gen[b:], len(gen) - b
            cost.forward_tokens += len(prefix) - 1 + len(cold.tokens) - 1
        cost.forward_tokens += 2 * len(ids) + max(len(gen) - 1, 0)
        rows.append(row)
    per_call = t_decode / n_decode if n_decode else 0.0
    n_p = len(rows) or 1
    per_token = max(0.0, (t_prompt / n_p - per_call) / max(1.0, n_prompt / n_p - 1)) if rows else 0.0
    return {"per_call_s": per_call, "per_token_s": per_token, "items": rows, "forward_tokens": cost.forward_tokens}

