"""The plan: what a run will compute, priced before it computes it (``--kvaudit-plan``, and the report's
``plan`` block).

A run's work per item and precision follows from its config and three lengths: the prompt ``P``, the
boundary ``b`` (generated tokens inside the prefix) and the suffix ``S``, with ``b + S <= M`` (the item
set's ``max_new_tokens``). Every cell step is priced by :func:`work`:

* a trajectory (live, and its replica): ``G = b + S`` calls (prompt in one, then one token each), ``P + G - 1`` tokens;
* a construction over ``prefix[:-1]`` (``P + b - 1`` ids) in its chunk schedule, then ``S`` decode calls:
  ``P + b - 1 + S`` tokens (``<= P + M - 1``, whatever the boundary);
* the 2x2's two cells on the first precision's prefix, the transplants on divergent items (``S`` each),
  the probes (batch invariance: one call of ``batch_size`` rows; attention and cache axes: their own trajectory
  and constructions).

Before a run ``b``, ``S``, eligibility and divergence are unknown. :func:`make_plan` gives two figures:

* ``forward_tokens`` / ``forward_calls``: an **upper bound**: every item eligible at every precision with the
  whole budget generated (``G = M``; the token count of a construction does not depend on ``b``), every item
  divergent up to ``--kvaudit-donor-units`` with the layer sweep and both controls;
* ``forward_tokens_expected``: the same model on the lengths, eligibility and divergence (prefill suffix vs
  live) of a calibration sample (the first :data:`SAMPLE` items at each precision), scaled to the item count.

The calibration also times forwards at each precision (a per-call and a per-token cost, fitted from the
sample's prompt forward and its one-token decode steps) and the model load; the time estimate is
``load + calls x per_call + tokens x per_token`` per precision, the compute divided over the workers.
After a run, :func:`price` applies the same model to the lengths the records show, which must equal the
forward tokens the run counted, token for token (the plan's model of the work is exact; only the lengths
were unknown). No pytest here; torch is imported inside the calibration.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from .schedules import schedule

if TYPE_CHECKING:
    from .config import AuditConfig
    from .store import Store

#: items per precision whose trajectory (and prefill) the calibration runs
SAMPLE = 8
#: boundary states alive at once in a cell: the live state kept, the prefill state kept, the one being built
#: or continued, and a transplant's copy
CACHES_ALIVE = 4
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
BOUND_WORDS = ("upper bound: every item eligible at every precision, every trajectory generating max_new_tokens, "
               "every item divergent (transplants, layer sweep and controls) up to the donor units")


@dataclass(frozen=True)
class Lengths:
    """One item's lengths at one precision: prompt, boundary, suffix; whether it is eligible and divergent."""

    prompt: int
    boundary: int
    suffix: int
    eligible: bool = True
    divergent: bool = False
    generated: int | None = None  # an ineligible trajectory's generation (default boundary + suffix)

    @property
    def gen(self) -> int:
        return self.generated if self.generated is not None else self.boundary + self.suffix


def add(acc: dict[str, list[int]], key: str, calls: int, tokens: int) -> None:
    a = acc.setdefault(key, [0, 0, 0])  # cells, calls, tokens
    a[0] += 1
    a[1] += calls
    a[2] += tokens


def _construction(acc: dict[str, list[int]], key: str, name: str, prompt: int, head: int, suffix: int) -> None:
    """A boundary state over ``head`` ids in ``name``'s schedule, then ``suffix`` decode steps."""
    calls = len(schedule(name, prompt, head)) if head >= 1 else 0
    add(acc, key, calls + suffix, head + suffix)


def _trajectory(acc: dict[str, list[int]], key: str, prompt: int, gen: int) -> None:
    add(acc, key, max(gen, 1), prompt + max(gen - 1, 0))


def work(x: Lengths, cfg: AuditConfig, primary: Lengths | None, donor: bool, sweep: bool, n_layers: int,
         batch_width: int | None = None) -> dict[str, list[int]]:
    """``{step: [cells, calls, tokens]}`` for one item at one precision; ``primary`` is the first precision's
    lengths (its prefix fixes the 2x2's ids), ``donor``/``sweep`` whether this unit gets transplants (it is
    divergent and within the donor units) and the layer sweep, ``batch_width`` the batch probe's width."""
    acc: dict[str, list[int]] = {}
    _trajectory(acc, "live", x.prompt, x.gen)
    if primary is not None and primary.eligible:
        # the 2x2's own cells on the first precision's prefix (also where this precision is ineligible)
        head = primary.prompt + primary.boundary - 1
        s = x.suffix if x.eligible else primary.suffix
        _construction(acc, "fixed_prefix_2x2", "incremental", x.prompt, head, s)
        _construction(acc, "fixed_prefix_2x2", "prefill", x.prompt, head, s)
    if not x.eligible:
        return acc
    head = x.prompt + x.boundary - 1
    _trajectory(acc, "live:replica", x.prompt, x.gen)
    for name in ("prefill", "prefill:replica", "incremental", *(f"chunked({c})" for c in cfg.chunks)):
        _construction(acc, name, name.split(":")[0], x.prompt, head, x.suffix)
    if donor:
        for _ in range(transplants_per_unit(sweep, n_layers)):
            add(acc, "transplants", x.suffix, x.suffix)
    if batch_width is not None:
        add(acc, "batch_invariance", 1, cfg.batch_size * max(batch_width, head))
    for attn in cfg.attn_axes:
        _trajectory(acc, f"axis:{attn}", x.prompt, x.gen)
        _construction(acc, f"axis:{attn}", "prefill", x.prompt, head, x.suffix)
    for kind in cfg.cache_axes:
        _trajectory(acc, f"cache:{kind}", x.prompt, x.gen)
        for name in ("prefill", "incremental"):
            _construction(acc, f"cache:{kind}", name, x.prompt, head, x.suffix)
        add(acc, f"cache:{kind}", x.suffix, x.suffix)  # the transplant's continuation
    return acc


def transplants_per_unit(sweep: bool, n_layers: int) -> int:
    """Continuations on one divergent unit: all layers both ways (and the sweep's subsets both ways), two
    shams, and (at most) two transplants of the identical layers."""
    from .cells import sweep_subsets

    return 2 * (1 + (len(sweep_subsets(n_layers)) if sweep else 0)) + 2 + 2


def total(parts: Iterable[Mapping[str, list[int]]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in parts:
        for k, (cells, calls, tokens) in p.items():
            a = out.setdefault(k, [0, 0, 0])
            a[0] += cells
            a[1] += calls
            a[2] += tokens
    return out


def bound(prompts: Sequence[int], cfg: AuditConfig, max_new: int, n_layers: int) -> dict[str, dict[str, list[int]]]:
    """Per precision, ``{step: [cells, calls, tokens]}`` at most, for items with these prompt lengths."""
    out: dict[str, dict[str, list[int]]] = {}
    width = max(prompts, default=0) + max_new
    donors, sweeps = cfg.donor_max_units, cfg.sweep_units  # the store spends them over the precisions in order
    for dtype in cfg.dtypes:
        parts = []
        for i, p in enumerate(prompts):
            # b = 1 and S = M - 1 maximise calls; tokens are the same for any b (P + M - 1 per construction)
            x = Lengths(p, 1, max_new - 1, generated=max_new)
            parts.append(work(x, cfg, x, donors > 0, donors > 0 and sweeps > 0, n_layers,
                              width if i < cfg.batch_units and cfg.batch_size >= 2 else None))
            donors, sweeps = donors - 1, sweeps - 1
        out[dtype] = total(parts)
    return out


def expected(prompts: Sequence[int], sample: Mapping[str, Sequence[Lengths]], cfg: AuditConfig,
             n_layers: int) -> dict[str, dict[str, list[int]]]:
    """Per precision, the work on the sample's lengths, eligibility and divergence, scaled to ``len(prompts)``;
    the transplants on the expected number of divergent units, spent over the precisions in order."""
    out: dict[str, dict[str, list[int]]] = {}
    primary = sample.get(cfg.primary_dtype, ())
    width = max(prompts, default=0)
    donors, sweeps = float(cfg.donor_max_units), float(cfg.sweep_units)
    for dtype in cfg.dtypes:
        rows = list(sample.get(dtype, ()))
        if not rows:
            continue
        parts = [work(x, cfg, primary[i] if i < len(primary) else None, False, False, n_layers,
                      width if i < cfg.batch_units and cfg.batch_size >= 2 else None)
                 for i, x in enumerate(rows)]
        scale = len(prompts) / len(rows)
        steps = {k: [round(v * scale) for v in a] for k, a in total(parts).items()}
        if "batch_invariance" in steps:  # the first batch_units items only, not scaled
            b = [p["batch_invariance"] for p in parts if "batch_invariance" in p]
            n_b = min(cfg.batch_units, len(prompts))
            steps["batch_invariance"] = [n_b, n_b, round(sum(t for _, _, t in b) / len(b) * n_b)]
        div = [x for x in rows if x.divergent]
        n_div = len(div) * scale
        units = min(n_div, max(0.0, donors))
        swept = min(units, max(0.0, sweeps))
        if units:
            s = sum(x.suffix for x in div) / len(div)
            n = units * transplants_per_unit(False, n_layers) + swept * (transplants_per_unit(True, n_layers)
                                                                         - transplants_per_unit(False, n_layers))
            steps["transplants"] = [round(n), round(n * s), round(n * s)]
        donors, sweeps = donors - units, sweeps - swept
        out[dtype] = steps
    return out


def sums(by: Mapping[str, Mapping[str, list[int]]]) -> tuple[int, int]:
    calls = sum(a[1] for steps in by.values() for a in steps.values())
    tokens = sum(a[2] for steps in by.values() for a in steps.values())
    return calls, tokens


# -- after a run: the same model on the records' lengths ---------------------------------------------
def price(records: Iterable[Any], cfg: AuditConfig) -> dict[str, int]:
    """Forward calls and tokens of a run, priced from its records' lengths with the plan's model: equal to
    what the decoder counted when the model of the work is exact."""
    acc: dict[str, list[int]] = {}
    for r in records:
        if r.error or not r.generated:
            continue
        p = len(r.prompt_ids)
        _trajectory(acc, "live", p, len(r.generated))
        if r.fixed:
            head = (r.fixed_prefix_len or 0) - 1
            for name, c in (("incremental", r.fixed["replay"]), ("prefill", r.fixed["prefill"])):
                _construction(acc, "fixed_prefix_2x2", name, p, head, len(c.suffix))
        if r.eligible:
            head = len(r.prefix) - 1
            rep = r.constructions["live:replica"]
            _trajectory(acc, "live:replica", p, r.boundary + len(rep.suffix) if rep.logits_fp else len(rep.suffix))
            for name, c in r.constructions.items():
                if name not in ("live", "live:replica"):
                    _construction(acc, name, name.split(":")[0], p, head, len(c.suffix))
            for t in r.transplants:
                add(acc, "transplants", len(t.suffix), len(t.suffix))
        probes = r.probes
        for o in [*probes.axes.values(), *probes.cache.values(), probes.batch]:
            if o:
                add(acc, "probes", 0, int(o.get("tokens", 0)))
    return {"forward_tokens": sum(a[2] for a in acc.values()),
            "forward_calls_cells": sum(a[1] for k, a in acc.items() if k != "probes")}


# -- calibration: a few real forwards at each precision -----------------------------------------------
def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


def calibrate(store: Store, sample: int = SAMPLE) -> dict[str, Any]:
    """Per precision: the model's load time, a per-call and a per-token forward cost, and the first ``sample``
    items' lengths (trajectory, then a prefill to see whether the item diverges). The precisions run last to
    first, so the model the store computes first stays loaded. Counted apart from the store's cost."""
    import torch

    from .cells import prompt_ids
    from .config import BoundaryRule
    from .constructions import Cost, Decoder, continue_greedy, trajectory

    def sync(dev: Any) -> None:
        if getattr(dev, "type", "") == "cuda":
            torch.cuda.synchronize(dev)

    cfg, iset = store.cfg, store.item_set
    out: dict[str, Any] = {"sample": sample, "dtypes": {}}
    t_all = time.perf_counter()
    tokens = 0
    for dtype in reversed(cfg.dtypes):
        t0 = time.perf_counter()
        h = store.handle(dtype)
        load_s = time.perf_counter() - t0
        cost = Cost()
        dec = Decoder(h.model, h.eos_ids, cost)
        items = [it for it in store.items if it.prompt_ids is not None or it.prompt is not None][:sample]
        prompts = [prompt_ids(it, h.tokenizer, cfg.chat_template, cfg.model) for it in items]
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
                            partial(_decode, h.tokenizer))
            sync(dec.device)
            # the trajectory's own prompt forward is charged at the prompt time just measured
            t_decode += max(0.0, time.perf_counter() - t2 - t_p)
            n_decode += cost.forward_calls - calls0 - 1
            row = {"prompt": len(ids), "generated": len(tr.generated), "boundary": tr.boundary or 0,
                   "eligible": tr.reason is None, "divergent": False}
            if tr.reason is None:
                head = list(tr.prefix[:-1])
                state = dec.build_state(head, [len(head)])
                suffix, _ = continue_greedy(dec, state, tr.prefix[-1], iset.max_new_tokens - (tr.boundary or 0))
                row["divergent"] = suffix != tr.suffix
                row["suffix"] = len(tr.suffix)
            rows.append(row)
        per_call = t_decode / n_decode if n_decode else 0.0
        n_p = len(rows) or 1
        # prompt forward = per_call + per_token x P: the per-token cost is what a longer forward adds
        per_token = max(0.0, (t_prompt / n_p - per_call) / max(1.0, n_prompt / n_p - 1)) if rows else 0.0
        out["dtypes"][dtype] = {"load_s": round(load_s, 4), "per_call_s": per_call, "per_token_s": per_token,
                                "items": rows, "forward_tokens": cost.forward_tokens}
        tokens += cost.forward_tokens
    out["seconds"] = round(time.perf_counter() - t_all, 3)
    out["forward_tokens"] = tokens
    return out


# -- the plan ----------------------------------------------------------------------------------------
def model_shape(model: Any) -> dict[str, int]:
    c = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    layers = int(getattr(c, "num_hidden_layers", 0) or getattr(c, "n_layer", 0))
    heads = int(getattr(c, "num_attention_heads", 0) or getattr(c, "n_head", 0) or 1)
    kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
    hidden = int(getattr(c, "hidden_size", 0) or getattr(c, "n_embd", 0))
    head_dim = int(getattr(c, "head_dim", None) or (hidden // heads if heads else 0))
    return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
            "parameters": int(sum(p.numel() for p in model.parameters()))}


def memory(shape: Mapping[str, int], positions: int, dtypes: Sequence[str], batch_size: int) -> dict[str, Any]:
    """Peak K/V bytes: layers x kv heads x head_dim x positions x bytes x 2 (K and V), times the caches alive."""
    alive = max(CACHES_ALIVE, batch_size)  # the batch probe's one cache holds batch_size rows
    per_pos = {d: shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 2 * DTYPE_BYTES[d] for d in dtypes}
    return {"positions": positions, "caches_alive": alive,
            "bytes_per_cache": {d: b * positions for d, b in per_pos.items()},
            "peak_cache_bytes": {d: b * positions * alive for d, b in per_pos.items()},
            "weights_bytes": {d: shape["parameters"] * DTYPE_BYTES[d] for d in dtypes},
            "basis": f"layers x kv heads x head_dim x {positions} positions (longest prompt + max_new_tokens) x "
                     f"bytes x 2 (K, V) x {alive} caches alive"}


def decides(needs: Mapping[str, float | None], have: Mapping[str, tuple[float | None, float | None]]) -> dict[str, Any]:
    """Set what a claim needs against what the run will have: at most (the bound) and as expected."""
    rows, verdicts = {}, []
    for what, need in needs.items():
        most, exp = have.get(what, (None, None))
        if need is None:
            v = "never"  # no amount of evidence clears the threshold
        elif most is None:
            v = "depends on the run"
        elif most < need:
            v = "no"
        elif exp is not None and exp >= need:
            v = "yes"
        else:
            v = "depends on the run"
        rows[what] = {"needs": need, "at_most": most, "expected": exp, "decides": v}
        verdicts.append(v)
    order = ("never", "no", "depends on the run", "yes")
    overall = min(verdicts, key=order.index) if verdicts else "yes"
    return {"decides": overall, "needs": rows}


def evidence(cfg: AuditConfig, items: int, sample: Mapping[str, Sequence[Lengths]]) -> dict[str, tuple[float | None, float | None]]:
    """What the run will have of each kind of evidence the claims name: (at most, expected)."""
    from .config import LOW_PRECISION

    d = len(cfg.dtypes)
    low = [x for x in cfg.dtypes if x in LOW_PRECISION]
    high = [x for x in cfg.dtypes if x not in LOW_PRECISION]

    def rate(dtype: str, attr: str) -> float | None:
        rows = sample.get(dtype, ())
        return sum(getattr(x, attr) for x in rows) / len(rows) if rows else None

    elig = [rate(x, "eligible") for x in cfg.dtypes]
    e_min = None if any(e is None for e in elig) else min(e for e in elig if e is not None) * items
    e_sum = None if any(e is None for e in elig) else sum(e for e in elig if e is not None) * items
    div_low = [rate(x, "divergent") for x in low]
    e_div_low = None if not low or any(v is None for v in div_low) else min(v for v in div_low if v is not None) * items
    div_all = [rate(x, "divergent") for x in cfg.dtypes]
    e_div = None if any(v is None for v in div_all) else sum(v for v in div_all if v is not None) * items
    return {
        "units": (items * d, e_sum),
        "replica_pairs": (2 * items * d, None if e_sum is None else 2 * e_sum),
        "eligible_items_per_precision": (items, e_min),
        "items_x_precisions": (items * d, e_sum),
        "units_per_high_precision": (items if high else 0, e_min if high else 0),
        "divergent_units_per_low_precision": (items if low else 0, e_div_low if low else 0),
        "divergent_units_per_direction": (min(items * d, cfg.donor_max_units),
                                          None if e_div is None else min(e_div, cfg.donor_max_units)),
    }


def make_plan(store: Store, claims: Sequence[Any], thresholds: Mapping[str, Mapping[str, float]],
              workers: int = 1, sample: int = SAMPLE) -> dict[str, Any]:
    """The plan of ``store``'s run over its whole item set (every shard), after a short calibration."""
    from .cells import chars_per_token, prompt_ids, surely_too_long
    from .claims.base import least_units

    cfg, iset = store.cfg, store.item_set
    # a sample of 0 (what a normal run's report block uses) runs no calibration at all: every trajectory of
    # a run is computed once, by the store, so the plan there is the bound and the memory, priced after
    # the run from the lengths it produced (priced_after_run); --kvaudit-plan calibrates
    cal: dict[str, Any] = (calibrate(store, sample) if sample else
                           {"sample": 0, "dtypes": {}, "seconds": 0.0, "forward_tokens": 0})
    h = store.handle(cfg.primary_dtype)
    shape = model_shape(h.model)
    m = iset.max_new_tokens
    prompts = []
    per_token = chars_per_token(h.tokenizer) if h.max_positions is not None else None
    for it in iset.items:
        if surely_too_long(it, per_token, h.max_positions):
            continue
        p = len(prompt_ids(it, h.tokenizer, cfg.chat_template, cfg.model))
        if h.max_positions is None or p + m <= h.max_positions:
            prompts.append(p)
    lens = {d: [Lengths(r["prompt"], r["boundary"], r.get("suffix", 0), r["eligible"], r["divergent"], r["generated"])
                for r in c["items"]] for d, c in cal["dtypes"].items()}
    most = bound(prompts, cfg, m, shape["layers"])
    exp = expected(prompts, lens, cfg, shape["layers"]) if sample else {}
    calls_b, tokens_b = sums(most)
    calls_e, tokens_e = sums(exp)

    def seconds(by: Mapping[str, Mapping[str, list[int]]]) -> float:
        s = 0.0
        for d, steps in by.items():
            c = cal["dtypes"].get(d, {})
            compute = sum(a[1] for a in steps.values()) * c.get("per_call_s", 0.0) + sum(
                a[2] for a in steps.values()) * c.get("per_token_s", 0.0)
            s += c.get("load_s", 0.0) + compute / max(1, workers)
        return round(s, 2)

    have = evidence(cfg, len(prompts), lens)
    verdicts = {c.name: decides(least_units(c, thresholds.get(c.name, {}), cfg), have) for c in claims}
    return {
        "items": len(prompts), "items_too_long": len(iset.items) - len(prompts), "precisions": list(cfg.dtypes),
        "max_new_tokens": m, "workers": workers, "model": shape,
        "cells": {d: {k: a[0] for k, a in steps.items()} for d, steps in most.items()},
        "steps": {d: {k: {"cells": a[0], "forward_calls": a[1], "forward_tokens": a[2],
                          "forward_tokens_expected": exp.get(d, {}).get(k, [0, 0, 0])[2]}
                      for k, a in steps.items()} for d, steps in most.items()},
        "forward_calls": calls_b, "forward_tokens": tokens_b, "bound": BOUND_WORDS,
        "forward_calls_expected": calls_e if sample else None, "forward_tokens_expected": tokens_e if sample else None,
        "expected_basis": f"the lengths, eligibility and divergence of the first {sample} items at each precision, "
                          f"scaled to {len(prompts)} items",
        "seconds_expected": seconds(exp) if sample else None, "seconds_bound": seconds(most) if sample else None,
        "memory": memory(shape, max(prompts, default=0) + m, cfg.dtypes, cfg.batch_size),
        "calibration": {"seconds": cal["seconds"], "forward_tokens": cal["forward_tokens"], "sample": sample,
                        **{d: {k: v for k, v in c.items() if k != "items"} for d, c in cal["dtypes"].items()}},
        "claims": verdicts,
    }
