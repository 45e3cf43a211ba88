"""The plan: what a run will compute, priced before it computes it (``--kvaudit-plan``, and the report's
``plan`` block).

The work is priced from lengths by :mod:`pytest_kvaudit.core.cost.pricing`. Before a run the lengths are unknown, and
:func:`make_plan` gives these figures:

* ``forward_tokens`` / ``forward_calls``: an **upper bound**: every item eligible at every precision with the
  whole budget generated (``G = M``; the token count of a construction does not depend on ``b``), every item
  divergent up to ``--kvaudit-donor-units`` with the layer sweep and both controls;
* ``forward_tokens_expected``: the same model on the lengths, eligibility and divergence (prefill suffix vs
  live) of a calibration sample (the first :data:`SAMPLE` items at each precision), scaled to the item count;
* ``forward_tokens_predicted``: the lengths of the model's recorded ledger where there is one for this
  model and these settings (exact in the environment that recorded it), else the expectation.

The calibration also times forwards at each precision (a per-call and a per-token cost, fitted from the
sample's prompt forward and its one-token decode steps) and the model load; the time estimate is
``load + calls x per_call + tokens x per_token`` per precision, the compute divided over the workers.
``--kvaudit-plan`` leaves the estimate in pytest's cache (:func:`remember`) and the next run of the same
settings reports it beside what it took (:func:`recall`). No pytest here; torch is imported inside the
calibration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.compute.cells import chars_per_token, prompt_ids, surely_too_long
from pytest_kvaudit.core.cost.evidence import StrictFn, decides, evidence, strict_plan
from pytest_kvaudit.core.cost.pricing import Lengths, total
from pytest_kvaudit.core.model.pipeline import exact_steps
from pytest_kvaudit.core.model.precisions import named
from pytest_kvaudit.core.planning.calibrate import SAMPLE, calibrate
from pytest_kvaudit.core.planning.ledger_price import ledger_prediction
from pytest_kvaudit.core.planning.strict_gate import most_items, selection_basis, strict_gate
from pytest_kvaudit.core.planning.unit_work import transplants_per_unit, work
from pytest_kvaudit.core.runtime.environment import environment

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig

#: items per precision whose trajectory (and prefill) the calibration runs
#: boundary states alive at once in a cell: the live state kept, the prefill state kept, the one being built
#: or continued, and a transplant's copy
CACHES_ALIVE = 4
BOUND_WORDS = ("upper bound: every item eligible at every precision, every trajectory generating max_new_tokens, "
               "every item divergent (transplants, layer sweep and controls) up to the donor units")


def bound(prompts: Sequence[int], cfg: AuditConfig, max_new: int, n_layers: int,
          recurrent: bool = False) -> dict[str, dict[str, list[int]]]:
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
                              width if i < cfg.batch_units and cfg.batch_size >= 2 else None, recurrent, i))
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
        if cfg.exact_items is not None:  # the replicas and the bridge: the first exact_items only
            share = min(cfg.exact_items, len(prompts)) / max(1, len(prompts))
            steps.update({k: [round(v * share) for v in steps[k]] for k in exact_steps(cfg) if k in steps})
        if "batch_invariance" in steps:  # the first batch_units items only, not scaled
            b = [p["batch_invariance"] for p in parts if "batch_invariance" in p]
            n_b = min(cfg.batch_units, len(prompts))
            steps["batch_invariance"] = [n_b, n_b, round(sum(t for _, _, t in b) / len(b) * n_b)]
        div = [x for x in rows if x.divergent]
        n_div = len(div) * scale
        units = min(n_div, max(0.0, donors))
        swept = min(units, max(0.0, sweeps))
        if units and cfg.computes("transplants"):
            s = sum(x.suffix for x in div) / len(div)
            plain, swept_one = transplants_per_unit(cfg, False, n_layers), transplants_per_unit(cfg, True, n_layers)
            n = units * plain + swept * (swept_one - plain)
            steps["transplants"] = [round(n), round(n * s), round(n * s)]
        donors, sweeps = donors - units, sweeps - swept
        out[dtype] = steps
    return out


def sums(by: Mapping[str, Mapping[str, list[int]]]) -> tuple[int, int]:
    calls = sum(a[1] for steps in by.values() for a in steps.values())
    tokens = sum(a[2] for steps in by.values() for a in steps.values())
    return calls, tokens


# -- the plan ----------------------------------------------------------------------------------------
def at_workers(parts: Sequence[float], workers: int) -> float:
    """Seconds on ``workers`` workers from (model loads, computation on one worker)."""
    return round(parts[0] + parts[1] / max(1, workers), 2)


def memory(shape: Mapping[str, int], positions: int, dtypes: Sequence[str], batch_size: int) -> dict[str, Any]:
    """Peak K/V bytes: layers x kv heads x head_dim x positions x bytes x 2 (K and V), times the caches alive."""
    alive = max(CACHES_ALIVE, batch_size)  # the batch probe's one cache holds batch_size rows
    per_pos = {d: named(d).nbytes(shape["layers"] * shape["kv_heads"] * shape["head_dim"] * 2) for d in dtypes}
    return {"positions": positions, "caches_alive": alive,
            "bytes_per_cache": {d: b * positions for d, b in per_pos.items()},
            "peak_cache_bytes": {d: b * positions * alive for d, b in per_pos.items()},
            "weights_bytes": {d: named(d).nbytes(shape["parameters"]) for d in dtypes},
            "basis": f"layers x kv heads x head_dim x {positions} positions (longest prompt + max_new_tokens) x "
                     f"bytes x 2 (K, V) x {alive} caches alive"}


@dataclass(frozen=True)
class ClaimAsks:
    """What the run's selected claims ask of the plan: ``least``, what each needs to decide
    (``Claim.least_evidence``); ``inapplicable``, why a claim cannot run here; ``strict``, each claim's further
    needs at given rates (:meth:`Claim.strict_needs`), for its strict n."""

    least: Mapping[str, Mapping[str, float | None]] = field(default_factory=dict)
    inapplicable: Mapping[str, str | None] = field(default_factory=dict)
    strict: Mapping[str, StrictFn] = field(default_factory=dict)

    def verdicts(self, cfg: AuditConfig, have: Mapping[str, Any], lens: Mapping[str, Sequence[Lengths]],
                 ) -> dict[str, dict[str, Any]]:
        """Per claim: whether the run's evidence decides it, and what n a strict gate needs of it."""
        return {name: {**decides(needs, have, self.inapplicable.get(name)),
                       "strict": strict_plan(needs, lens, cfg, self.strict.get(name))}
                for name, needs in self.least.items()}


def prompt_lengths(store: Store) -> dict[str, int | None]:
    """Item -> prompt length, None where the item is too long to run (its prompt and budget past the window)."""
    cfg, iset = store.cfg, store.item_set
    h = store.handle(cfg.primary_dtype)
    m = iset.max_new_tokens
    per_token = chars_per_token(h.tokenizer) if h.max_positions is not None else None
    out: dict[str, int | None] = {}
    for it in iset.items:
        p = None if surely_too_long(it, per_token, h.max_positions) else len(
            prompt_ids(it, h.tokenizer, cfg.chat_template, cfg.model))
        out[it.id] = p if p is not None and (h.max_positions is None or p + m <= h.max_positions) else None
    return out


def seconds_parts(by: Mapping[str, Mapping[str, list[int]]], cal: Mapping[str, Any]) -> tuple[float, float]:
    """(model loads, computation on one worker) in seconds: each worker loads every precision's model once, the
    computation divides over the workers."""
    load = compute = 0.0
    for d, steps in by.items():
        c = cal["dtypes"].get(d, {})
        compute += sum(a[1] for a in steps.values()) * c.get("per_call_s", 0.0) + sum(
            a[2] for a in steps.values()) * c.get("per_token_s", 0.0)
        load += c.get("load_s", 0.0)
    return load, compute


def prediction(recorded: dict[str, Any], exp: dict[str, dict[str, list[int]]], sample: int,
               ) -> tuple[dict[str, dict[str, list[int]]] | None, str | None]:
    """The predicted work and its basis: the recorded ledger's lengths where one applies (exact in the
    environment that recorded it), else the calibration's expectation (--kvaudit-plan), else none (a normal run
    has only the bound). Takes the ledger's steps out of ``recorded``."""
    if recorded["usable"]:
        differences = "; ".join(recorded["environment_differences"]
                                or ["axes or old transplant records priced by the model"])
        exact = ": exact, a run here reproduces them" if recorded["exact"] else f" (an estimate: {differences})"
        return recorded.pop("steps"), f"the lengths recorded in the ledger {recorded['path']}{exact}"
    recorded.pop("steps", None)
    if not sample:
        return None, None
    return exp, f"the calibration sample ({sample} items per precision), scaled"


def steps_block(most: Mapping[str, Mapping[str, list[int]]], exp: Mapping[str, Mapping[str, list[int]]],
                predicted: Mapping[str, Mapping[str, list[int]]] | None) -> dict[str, dict[str, dict[str, Any]]]:
    """Per precision and step: its cells, and its forward calls and tokens at most, expected and predicted."""
    return {d: {k: {"cells": a[0], "forward_calls": a[1], "forward_tokens": a[2],
                    "forward_tokens_expected": exp.get(d, {}).get(k, [0, 0, 0])[2],
                    "forward_tokens_predicted": None if predicted is None else
                    predicted.get(d, {}).get(k, [0, 0, 0])[2]}
                for k, a in steps.items()} for d, steps in most.items()}


def make_plan(store: Store, asks: ClaimAsks, ledger: Path | None = None, workers: int = 1,
              sample: int = SAMPLE) -> dict[str, Any]:
    """The plan of ``store``'s run over its whole item set (every shard), after a short calibration, for what the
    selected claims ask (``asks``); ``ledger`` is the recorded ledger of this model, if any, whose lengths
    predict the run."""
    cfg, iset = store.cfg, store.item_set
    # a sample of 0 (what a normal run's report block uses) runs no calibration at all: every trajectory of
    # a run is computed once, by the store, so the plan there is the bound and the memory, priced after
    # the run from the lengths it produced (priced_after_run); --kvaudit-plan calibrates
    cal: dict[str, Any] = (calibrate(store, sample) if sample else
                           {"sample": 0, "dtypes": {}, "seconds": 0.0, "forward_tokens": 0})
    h = store.handle(cfg.primary_dtype)
    shape, m = h.shape(), iset.max_new_tokens
    prompt_of = prompt_lengths(store)
    prompts = [p for p in prompt_of.values() if p is not None]
    env = environment(h.device) | {"attn_implementation": h.attn_implementation}
    # the ledger's lengths price this run only under the same stop rule (the item set's, as resolved)
    recorded = ledger_prediction(cfg.replace(stop_regex=iset.stop_regex), ledger, h.identity, env, prompt_of,
                                 shape["layers"])
    lens = {d: rows_lengths(c["items"], m) for d, c in cal["dtypes"].items()}
    # the claims' rates: the ledger's units of every item where one applies, else the calibration's first items
    recorded_rows = recorded.pop("rows", None) if recorded["usable"] and sample else None
    basis_rows = {d: rows_lengths(r, m) for d, r in recorded_rows.items()} if recorded_rows else lens
    recorded.pop("rows", None)
    most = bound(prompts, cfg, m, shape["layers"], bool(shape["recurrent"]))
    exp = expected(prompts, lens, cfg, shape["layers"]) if sample else {}
    calls_b, tokens_b = sums(most)
    calls_e, tokens_e = sums(exp)
    predicted, basis = prediction(recorded, exp, sample)
    calls_p, tokens_p = sums(predicted) if predicted is not None else (None, None)
    timed = seconds_parts(predicted, cal) if sample and predicted is not None else None
    bound_words = BOUND_WORDS if cfg.computes("transplants") else BOUND_WORDS.split(", every item divergent")[0]
    out: dict[str, Any] = {
        "items": len(prompts), "items_too_long": len(iset.items) - len(prompts), "precisions": list(cfg.dtypes),
        "max_new_tokens": m, "workers": workers, "model": shape,
        "cells": {d: {k: a[0] for k, a in steps.items()} for d, steps in most.items()},
        "steps": steps_block(most, exp, predicted),
        "forward_calls": calls_b, "forward_tokens": tokens_b, "bound": bound_words,
        "forward_calls_expected": calls_e if sample else None, "forward_tokens_expected": tokens_e if sample else None,
        "expected_basis": f"the lengths, eligibility and divergence of the first {sample} items at each precision, "
                          f"scaled to {len(prompts)} items",
        "forward_tokens_predicted": tokens_p, "forward_calls_predicted": calls_p, "predicted_basis": basis,
        "ledger": recorded,
        "seconds_expected": at_workers(timed, workers) if timed is not None else None,
        "seconds_parts": timed,
        "seconds_bound": at_workers(seconds_parts(most, cal), workers) if sample else None,
        "memory": memory(shape, max(prompts, default=0) + m, cfg.dtypes, cfg.batch_size),
        "calibration": {"seconds": cal["seconds"], "forward_tokens": cal["forward_tokens"], "sample": sample,
                        **{d: {k: v for k, v in c.items() if k != "items"} for d, c in cal["dtypes"].items()}},
        "claims": asks.verdicts(cfg, evidence(cfg, len(prompts), basis_rows), basis_rows),
        "work": None if cfg.work is None else list(cfg.work),
    }
    if sample:  # --kvaudit-plan: the strict gate these claims can pass on this item set
        basis = selection_basis(basis_rows, recorded if recorded_rows else None)
        out["strict_gate"] = strict_gate(out["claims"], most_items(iset), basis, cfg.exact_items)
    return out


def rows_lengths(rows: Sequence[Mapping[str, Any]], max_new: int) -> list[Lengths]:
    """A calibration's (or a ledger's) rows as lengths, labels included where they are known."""
    return [Lengths(r["prompt"], r["boundary"], r.get("suffix", 0), r["eligible"], r["divergent"], r["generated"],
                    max_new - r["boundary"], tuple(r["right"]) if r.get("right") is not None else None)
            for r in rows]
