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


# -- the same model on known lengths: a run's records, or a recorded ledger ---------------------------
@dataclass(frozen=True)
class Unit:
    """What pricing needs of one (item, precision), known after it ran (its records) or from a ledger that
    recorded it: the lengths of every trajectory and continuation, and the forward tokens of its probes."""

    prompt: int
    generated: int
    fixed: tuple[int, tuple[int, ...]] | None = None  # the 2x2's head (ids before the last) and its two suffixes
    head: int | None = None  # eligible: ids before the prefix's last
    replica: int = 0  # the replica trajectory's generated tokens
    continuations: tuple[tuple[str, int], ...] = ()  # (construction, suffix length), live and its replica apart
    transplant_tokens: int = 0  # every transplant continuation (one token a call)
    probe_tokens: int = 0


def unit_of_record(r: Any) -> Unit | None:
    """A computed record's lengths (None for an item that ran no forward)."""
    if r.error or not r.generated:
        return None
    fixed = None
    if r.fixed:
        fixed = ((r.fixed_prefix_len or 0) - 1, (len(r.fixed["replay"].suffix), len(r.fixed["prefill"].suffix)))
    head = replica = 0
    conts: tuple[tuple[str, int], ...] = ()
    if r.eligible:
        head = len(r.prefix) - 1
        rep = r.constructions["live:replica"]
        replica = r.boundary + len(rep.suffix) if rep.logits_fp else len(rep.suffix)
        conts = tuple((k, len(c.suffix)) for k, c in r.constructions.items() if k not in ("live", "live:replica"))
    probes = r.probes
    tokens = sum(int(o.get("tokens", 0)) for o in [*probes.axes.values(), *probes.cache.values(), probes.batch] if o)
    return Unit(len(r.prompt_ids), len(r.generated), fixed, head if r.eligible else None, replica, conts,
                sum(len(t.suffix) for t in r.transplants), tokens)


def price_units(units: Iterable[Unit]) -> dict[str, list[int]]:
    """``{step: [cells, calls, tokens]}`` of these units (probes: tokens only, as the records count them)."""
    acc: dict[str, list[int]] = {}
    for u in units:
        _trajectory(acc, "live", u.prompt, u.generated)
        if u.fixed is not None:
            head, suffixes = u.fixed
            for name, s in zip(("incremental", "prefill"), suffixes):
                _construction(acc, "fixed_prefix_2x2", name, u.prompt, head, s)
        if u.head is not None:
            _trajectory(acc, "live:replica", u.prompt, u.replica)
            for name, s in u.continuations:
                _construction(acc, name, name.split(":")[0], u.prompt, u.head, s)
            if u.transplant_tokens:
                add(acc, "transplants", u.transplant_tokens, u.transplant_tokens)
        if u.probe_tokens:
            add(acc, "probes", 0, u.probe_tokens)
    return acc


def price(records: Iterable[Any], cfg: AuditConfig | None = None) -> dict[str, int]:
    """Forward calls and tokens of a run, priced from its records' lengths with the plan's model: equal to
    what the decoder counted when the model of the work is exact."""
    acc = price_units(u for u in map(unit_of_record, records) if u is not None)
    return {"forward_tokens": sum(a[2] for a in acc.values()),
            "forward_calls_cells": sum(a[1] for k, a in acc.items() if k != "probes")}


def _ids_len(text: Any) -> int:
    return len(str(text).split()) if text else 0


def units_of_ledger(doc: Mapping[str, Any], prompts: Mapping[str, int], cfg: AuditConfig,
                    n_layers: int) -> tuple[dict[tuple[str, str], Unit], int]:
    """The units a recorded ledger prices, for the items in ``prompts`` (id -> prompt length, in item order):
    a run that reproduces the ledger's trajectories has these lengths. Also returns how many transplant units
    were priced by the plan's model rather than as recorded (a ledger written before ``transplant_tokens``:
    each continuation at the donor's suffix length). The probes are not in a ledger."""
    out: dict[tuple[str, str], Unit] = {}
    recorded = doc.get("units", {})
    dtypes = list(cfg.dtypes)
    guessed = spent = 0
    fixed_head: dict[str, int] = {}
    for item, p in prompts.items():
        first = recorded.get(f"{item}@{dtypes[0]}") if dtypes else None
        if first is not None and first.get("reason") is None and first.get("boundary") is not None:
            fixed_head[item] = p + int(first["boundary"]) - 1
    for d in dtypes:  # a single run's order: the sweep goes to the first transplant units
        for item, p in prompts.items():
            u = recorded.get(f"{item}@{d}")
            if u is None or not u.get("generated"):
                continue
            fixed = None
            if u.get("fixed") and item in fixed_head:
                fixed = (fixed_head[item], (_ids_len(u["fixed"]["replay"]["suffix"]),
                                            _ids_len(u["fixed"]["prefill"]["suffix"])))
            head, replica, transplant = None, 0, 0
            conts: tuple[tuple[str, int], ...] = ()
            cs = u.get("constructions") or {}
            if u.get("reason") is None and cs:
                b = int(u["boundary"])
                head = p + b - 1
                rep = cs["live:replica"]
                replica = b + _ids_len(rep["suffix"]) if rep.get("logits_fp") else _ids_len(rep["suffix"])
                conts = tuple((k, _ids_len(c["suffix"])) for k, c in sorted(cs.items()) if k not in ("live", "live:replica"))
                if "transplant_tokens" in u:
                    transplant = int(u["transplant_tokens"])
                elif u.get("transplants"):
                    guessed += 1
                    transplant = transplants_per_unit(spent < cfg.sweep_units, n_layers) * _ids_len(cs["live"]["suffix"])
                spent += bool(u.get("transplants"))
            out[(item, d)] = Unit(p, _ids_len(u["generated"]), fixed, head, replica, conts, transplant)
    return out, guessed


def batch_probe_tokens(head: int, index: int, prompts: Sequence[int | None], cfg: AuditConfig) -> int:
    """The batch-invariance probe's tokens for the item at ``index`` of the item set: its boundary head and the
    next ``batch_size - 1`` items' prompts (None: too long to run), left-padded to one width (:mod:`.probes`)."""
    if index >= cfg.batch_units or cfg.batch_size < 2:
        return 0
    others = [p for j in range(1, cfg.batch_size) if (p := prompts[(index + j) % len(prompts)]) is not None]
    return 0 if not others else (1 + len(others)) * max(head, *others)


def ledger_prediction(cfg: AuditConfig, identity: Mapping[str, Any], env: Mapping[str, Any],
                      prompts: Mapping[str, int | None], n_layers: int) -> dict[str, Any]:
    """The run priced on the lengths of its recorded ledger (:func:`pytest_kvaudit.ledger.default_path`), when
    one was recorded for this model and these settings. In the environment that recorded it a run
    reproduces every trajectory bit for bit (what ``ledger_audit`` asserts), so the price is the run's
    forward tokens exactly; ``usable`` says whether it applies and ``why`` when not."""
    from . import ledger as L
    from .errors import KvauditError

    path = L.default_path(cfg.snapshots, cfg.model)
    out: dict[str, Any] = {"path": str(path), "usable": False}
    if not path.is_file():
        return out | {"why": f"no ledger recorded at {path}"}
    try:
        doc = L.read(path)
    except KvauditError as exc:
        return out | {"why": str(exc)}
    current = {"model": dict(identity), "environment": dict(env),
               "config": {"boundary": doc["config"].get("boundary"), "max_new_tokens": doc["config"].get("max_new_tokens"),
                          "answer_regex": doc["config"].get("answer_regex"), "dtypes": list(cfg.dtypes)}}
    diffs = L.identity_differences(doc, current, tokens_only=True)
    if diffs:
        return out | {"why": f"the ledger at {path} was recorded for another model or settings: {'; '.join(diffs)}"}
    order = [i for i, p in prompts.items() if p is not None]
    units, guessed = units_of_ledger(doc, {i: int(prompts[i] or 0) for i in order}, cfg, n_layers)
    lengths = list(prompts.values())
    index = {i: k for k, i in enumerate(prompts)}
    steps: dict[str, dict[str, list[int]]] = {}
    for d in cfg.dtypes:
        mine = [(i, units[(i, d)]) for i in order if (i, d) in units]
        probed = [Unit(u.prompt, 0, probe_tokens=batch_probe_tokens(u.head, index[i], lengths, cfg))
                  for i, u in mine if u.head is not None]
        acc = price_units([u for _, u in mine])
        batch = price_units(probed).get("probes")
        if batch:
            acc["batch_invariance"] = [batch[0], batch[0], batch[2]]
        for _, u in mine:  # the axes run their own trajectories: priced on this precision's lengths
            if u.head is not None and (cfg.attn_axes or cfg.cache_axes):
                x = Lengths(u.prompt, u.head - u.prompt + 1, dict(u.continuations).get("prefill", 0))
                extra = work(x, cfg.replace(chunks=()), None, False, False, n_layers)
                for k, a in extra.items():
                    if k.startswith(("axis:", "cache:")):
                        acc[k] = [v + w for v, w in zip(acc.get(k, [0, 0, 0]), a)]
        steps[d] = acc
    missing = [i for i in order if any((i, d) not in units for d in cfg.dtypes)]
    env_diffs = [x for x in L.identity_differences(doc, current, tokens_only=False) if x.startswith("environment.")]
    exact = not missing and not guessed and not env_diffs and not cfg.attn_axes and not cfg.cache_axes
    return out | {"usable": not missing, "exact": exact, "steps": steps, "items_not_recorded": len(missing),
                  "transplant_units_priced_by_model": guessed, "environment_differences": env_diffs,
                  "why": None if not missing else f"{len(missing)} of {len(order)} items are not in the ledger at {path}"}


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
def at_workers(parts: Sequence[float], workers: int) -> float:
    """Seconds on ``workers`` workers from (model loads, computation on one worker)."""
    return round(parts[0] + parts[1] / max(1, workers), 2)


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
    from .environment import environment

    cfg, iset = store.cfg, store.item_set
    # a sample of 0 (what a normal run's report block uses) runs no calibration at all: every trajectory of
    # a run is computed once, by the store, so the plan there is the bound and the memory, priced after
    # the run from the lengths it produced (priced_after_run); --kvaudit-plan calibrates
    cal: dict[str, Any] = (calibrate(store, sample) if sample else
                           {"sample": 0, "dtypes": {}, "seconds": 0.0, "forward_tokens": 0})
    h = store.handle(cfg.primary_dtype)
    shape = model_shape(h.model)
    m = iset.max_new_tokens
    per_token = chars_per_token(h.tokenizer) if h.max_positions is not None else None
    prompt_of: dict[str, int | None] = {}  # item -> prompt length, None where the item is too long to run
    for it in iset.items:
        p = None if surely_too_long(it, per_token, h.max_positions) else len(
            prompt_ids(it, h.tokenizer, cfg.chat_template, cfg.model))
        prompt_of[it.id] = p if p is not None and (h.max_positions is None or p + m <= h.max_positions) else None
    prompts = [p for p in prompt_of.values() if p is not None]
    env = environment(h.device) | {"attn_implementation": h.attn_implementation}
    recorded = ledger_prediction(cfg, h.identity, env, prompt_of, shape["layers"])
    lens = {d: [Lengths(r["prompt"], r["boundary"], r.get("suffix", 0), r["eligible"], r["divergent"], r["generated"])
                for r in c["items"]] for d, c in cal["dtypes"].items()}
    most = bound(prompts, cfg, m, shape["layers"])
    exp = expected(prompts, lens, cfg, shape["layers"]) if sample else {}
    calls_b, tokens_b = sums(most)
    calls_e, tokens_e = sums(exp)

    def parts(by: Mapping[str, Mapping[str, list[int]]]) -> tuple[float, float]:
        """(model loads, computation on one worker) in seconds: each worker loads every precision's model once,
        the computation divides over the workers."""
        load = compute = 0.0
        for d, steps in by.items():
            c = cal["dtypes"].get(d, {})
            compute += sum(a[1] for a in steps.values()) * c.get("per_call_s", 0.0) + sum(
                a[2] for a in steps.values()) * c.get("per_token_s", 0.0)
            load += c.get("load_s", 0.0)
        return load, compute

    def seconds(by: Mapping[str, Mapping[str, list[int]]]) -> float:
        return at_workers(parts(by), workers)

    # the prediction: the recorded ledger's lengths where one applies (exact in the environment that recorded
    # it), else the calibration's expectation (--kvaudit-plan), else none (a normal run has only the bound)
    if recorded["usable"]:
        predicted: dict[str, dict[str, list[int]]] | None = recorded.pop("steps")
        basis: str | None = (f"the lengths recorded in the ledger {recorded['path']}"
                 + (": exact, a run here reproduces them" if recorded["exact"] else " (an estimate: "
                    + "; ".join(recorded["environment_differences"] or ["axes or old transplant records priced by the model"])
                    + ")"))
    else:
        recorded.pop("steps", None)
        predicted = exp if sample else None
        basis = f"the calibration sample ({sample} items per precision), scaled" if sample else None
    calls_p, tokens_p = sums(predicted) if predicted is not None else (None, None)
    have = evidence(cfg, len(prompts), lens)
    verdicts = {c.name: decides(least_units(c, thresholds.get(c.name, {}), cfg), have) for c in claims}
    return {
        "items": len(prompts), "items_too_long": len(iset.items) - len(prompts), "precisions": list(cfg.dtypes),
        "max_new_tokens": m, "workers": workers, "model": shape,
        "cells": {d: {k: a[0] for k, a in steps.items()} for d, steps in most.items()},
        "steps": {d: {k: {"cells": a[0], "forward_calls": a[1], "forward_tokens": a[2],
                          "forward_tokens_expected": exp.get(d, {}).get(k, [0, 0, 0])[2],
                          "forward_tokens_predicted": None if predicted is None else
                          predicted.get(d, {}).get(k, [0, 0, 0])[2]}
                      for k, a in steps.items()} for d, steps in most.items()},
        "forward_calls": calls_b, "forward_tokens": tokens_b, "bound": BOUND_WORDS,
        "forward_calls_expected": calls_e if sample else None, "forward_tokens_expected": tokens_e if sample else None,
        "expected_basis": f"the lengths, eligibility and divergence of the first {sample} items at each precision, "
                          f"scaled to {len(prompts)} items",
        "forward_tokens_predicted": tokens_p, "forward_calls_predicted": calls_p, "predicted_basis": basis,
        "ledger": recorded,
        "seconds_expected": seconds(predicted) if sample and predicted is not None else None,
        "seconds_parts": parts(predicted) if sample and predicted is not None else None,
        "seconds_bound": seconds(most) if sample else None,
        "memory": memory(shape, max(prompts, default=0) + m, cfg.dtypes, cfg.batch_size),
        "calibration": {"seconds": cal["seconds"], "forward_tokens": cal["forward_tokens"], "sample": sample,
                        **{d: {k: v for k, v in c.items() if k != "items"} for d, c in cal["dtypes"].items()}},
        "claims": verdicts,
    }


# -- the estimate a later run compares itself with ----------------------------------------------------
#: pytest's cache key under which --kvaudit-plan leaves its estimate for the run that follows it
CACHE_KEY = "kvaudit/plan"


def run_key(cfg: AuditConfig) -> str:
    """Which run a plan priced: the checkpoint and every setting that decides the work."""
    import json
    from pathlib import Path

    from .partials import plan_of

    model = str(Path(cfg.model).resolve()) if Path(cfg.model).exists() else cfg.model
    return json.dumps([model, plan_of(cfg)], sort_keys=True, default=list)


def remember(cache: Any, cfg: AuditConfig, plan: Mapping[str, Any]) -> None:
    """Leave the plan's estimate in pytest's ``cache`` (None with ``-p no:cacheprovider``: nothing kept)."""
    if cache is not None:
        cache.set(CACHE_KEY, {"key": run_key(cfg), "made": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              **{k: plan.get(k) for k in ("seconds_parts", "workers", "forward_tokens_predicted")}})


def recall(cache: Any, cfg: AuditConfig, workers: int) -> dict[str, Any]:
    """The estimate a --kvaudit-plan run left for this same run, for ``workers`` workers ({} when none, or
    for another run)."""
    got = cache.get(CACHE_KEY, None) if cache is not None else None
    if not isinstance(got, dict) or got.get("key") != run_key(cfg) or not got.get("seconds_parts"):
        return {}
    return {"made": got.get("made"), "planned_workers": got.get("workers"), "workers": workers,
            "seconds_expected": at_workers(got["seconds_parts"], workers),
            "forward_tokens_predicted": got.get("forward_tokens_predicted")}
