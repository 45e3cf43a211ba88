"""The price of a run in forward calls and tokens, from lengths: the plan's model of the work.

A run's work per item and precision follows from its config and three lengths: the prompt ``P``, the
boundary ``b`` (generated tokens inside the prefix) and the suffix ``S``, with ``b + S <= M`` (the item
set's ``max_new_tokens``). Every cell step is priced by its declaration
(:class:`pytest_kvaudit.core.model.pipeline.Step`), the transplants and the probes by theirs
(:mod:`pytest_kvaudit.core.compute.transplants`,
:mod:`pytest_kvaudit.core.compute.probes`); the plan adds them up per unit
(:func:`pytest_kvaudit.core.planning.unit_work.work`):

* a trajectory (live, and its replica): ``G = b + S`` calls (prompt in one, then one token each), ``P + G - 1`` tokens;
* a construction over ``prefix[:-1]`` (``P + b - 1`` ids) in its chunk schedule, then ``S`` decode calls:
  ``P + b - 1 + S`` tokens (``<= P + M - 1``, whatever the boundary);
* the 2x2's two cells on the first precision's prefix, the transplants on divergent items (``S`` each),
  the probes (batch invariance: one call of ``batch_size`` rows; attention and cache axes: their own trajectory
  and constructions).

The lengths come from assumptions (the plan's bound and its calibrated expectation), from a
run's records (:func:`price`, which must equal the forward tokens the run counted, token for token: the
model of the work is exact) or from a recorded ledger (:func:`ledger_prediction`: a run that reproduces the
ledger has its lengths, so the price is exact before the run). No pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.model.engine_protocol import RequestPrice  # noqa: F401 (its old home)
from pytest_kvaudit.core.model.pipeline import (
    FIXED,
    LIVE,
    LIVE_REPLICA,
    replica_generated,
    request_costs,
    step_named,
)

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.config import AuditConfig



@dataclass(frozen=True)
class Lengths:
    """One item's lengths at one precision: prompt, boundary, suffix; whether it is eligible and divergent."""

    prompt: int
    boundary: int
    suffix: int
    eligible: bool = True
    divergent: bool = False
    generated: int | None = None  # an ineligible trajectory's generation (default boundary + suffix)
    budget: int | None = None  # the suffix's token budget (default the suffix): what a request may decode
    #: (live right, prefill right) where the labels are known (a calibration or a ledger): whether they can move
    right: tuple[bool, bool] | None = None

    @property
    def gen(self) -> int:
        return self.generated if self.generated is not None else self.boundary + self.suffix


def add(acc: dict[str, list[int]], key: str, calls: int, tokens: int) -> None:
    a = acc.setdefault(key, [0, 0, 0])  # cells, calls, tokens
    a[0] += 1
    a[1] += calls
    a[2] += tokens


def _construction(acc: dict[str, list[int]], key: str, name: str, prompt: int, head: int, suffix: int) -> None:
    """A boundary state over ``head`` ids in the schedule of the step ``name``, then ``suffix`` decode steps."""
    add(acc, key, *step_named(name).price(prompt, head, suffix))


def _trajectory(acc: dict[str, list[int]], key: str, prompt: int, gen: int) -> None:
    add(acc, key, *LIVE.price(prompt, gen))


def _fixed(acc: dict[str, list[int]], prompt: int, head: int, suffixes: tuple[int, int]) -> None:
    """The 2x2's own two cells on the first precision's ``head`` ids."""
    for step, s in zip(FIXED, suffixes):
        add(acc, step.group, *step.price(prompt, head, s))


def total(parts: Iterable[Mapping[str, list[int]]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for p in parts:
        for k, (cells, calls, tokens) in p.items():
            a = out.setdefault(k, [0, 0, 0])
            a[0] += cells
            a[1] += calls
            a[2] += tokens
    return out


# -- the same model on known lengths: a run's records, or a recorded ledger ---------------------------
@dataclass(frozen=True)
class Unit:
    """What pricing needs of one (item, precision), known after it ran (its records) or from a ledger that
    recorded it: the lengths of every trajectory and continuation, and the forward tokens of its probes."""

    prompt: int
    generated: int
    fixed: tuple[int, tuple[int, ...]] | None = None  # the 2x2's head (ids before the last) and its two suffixes
    head: int | None = None  # eligible: ids before the prefix's last
    replica: int | None = 0  # the replica trajectory's generated tokens (None: not computed)
    continuations: tuple[tuple[str, int], ...] = ()  # (construction, suffix length), live and its replica apart
    transplant_tokens: int = 0  # every transplant continuation (one token a call)
    probe_tokens: int = 0
    transplants: int = 0  # how many continuations ``transplant_tokens`` sums (a request-level engine prefills each)


def unit_of_record(r: Any) -> Unit | None:
    """A computed record's lengths (None for an item that ran no forward)."""
    if r.error or not r.generated:
        return None
    fixed = None
    if r.fixed:
        fixed = ((r.fixed_prefix_len or 0) - 1, (len(r.fixed["replay"].suffix), len(r.fixed["prefill"].suffix)))
    head = 0
    replica: int | None = 0
    conts: tuple[tuple[str, int], ...] = ()
    if r.eligible:
        head = len(r.prefix) - 1
        replica = replica_generated(r) if LIVE_REPLICA.name in r.constructions else None
        conts = tuple((k, len(c.suffix)) for k, c in r.constructions.items() if k not in (LIVE.name, LIVE_REPLICA.name))
    probes = r.probes
    tokens = sum(int(o.get("tokens", 0)) for o in [*probes.axes.values(), *probes.cache.values(), probes.batch] if o)
    return Unit(len(r.prompt_ids), len(r.generated), fixed, head if r.eligible else None, replica, conts,
                sum(len(t.suffix) for t in r.transplants), tokens, len(r.transplants))


def price_units(units: Iterable[Unit], request_price: RequestPrice | None = None,
                max_new: int | None = None) -> dict[str, list[int]]:
    """``{step: [cells, calls, tokens]}`` of these units (probes: tokens only, as the records count them); a
    request-level engine's steps at its own price (``request_price``,
    :attr:`pytest_kvaudit.core.engine.record.EngineSpec.request_price`; ``max_new`` the item set's, whose rest after
    the boundary a batch's other requests decode)."""
    acc: dict[str, list[int]] = {}
    own = request_price or (lambda *_: None)
    for u in units:
        _trajectory(acc, LIVE.name, u.prompt, u.generated)
        if u.fixed is not None:
            head, (a, b) = u.fixed
            _fixed(acc, u.prompt, head, (a, b))
        if u.head is not None:
            if u.replica is not None:
                _trajectory(acc, LIVE_REPLICA.name, u.prompt, u.replica)
            budget = max_new - (u.head - u.prompt + 1) if max_new is not None else None
            for name, s in u.continuations:
                priced = own(name, u.prompt, u.head, s, s if budget is None else budget)
                if priced is not None:
                    add(acc, name, *priced)
                else:
                    _construction(acc, name, name, u.prompt, u.head, s)
            if u.transplant_tokens:
                # a request-level engine prefills each transplant's receiver again: one more step and head ids each
                n = u.transplants if own("transplant", u.prompt, u.head, 0, 0) is not None else 0
                add(acc, "transplants", u.transplant_tokens + n, u.transplant_tokens + n * u.head)
        if u.probe_tokens:
            add(acc, "probes", 0, u.probe_tokens)
    return acc


def price(records: Iterable[Any]) -> dict[str, int]:
    """Forward calls and tokens of a run, priced from its records' lengths with the plan's model: equal to
    what the decoder counted when the model of the work is exact."""
    records = list(records)
    requested = [request_costs(r) for r in records if not r.error]  # a request-level engine's: as it counted
    units = [(r, u) for r, u in zip(records, map(unit_of_record, records)) if u is not None]
    acc = price_units(u for r, u in units if not request_costs(r))
    probed = sum(u.probe_tokens for r, u in units if request_costs(r))  # its probes (vLLM's fp8): as they counted
    spent = sum(t for c in requested for _, t in c.values())
    return {"forward_tokens": sum(a[2] for a in acc.values()) + spent + probed,
            "forward_calls_cells": sum(a[1] for k, a in acc.items() if k != "probes") +
            sum(n for c in requested for n, _ in c.values())}


def _ids_len(text: Any) -> int:
    return len(str(text).split()) if text else 0


def units_of_ledger(doc: Mapping[str, Any], prompts: Mapping[str, int], cfg: AuditConfig,
                    per_unit: Callable[[bool], int]) -> tuple[dict[tuple[str, str], Unit], int]:
    """The units a recorded ledger prices, for the items in ``prompts`` (id -> prompt length, in item order):
    a run that reproduces the ledger's trajectories has these lengths. Also returns how many transplant units
    were priced by the plan's model rather than as recorded (a ledger written before ``transplant_tokens``:
    ``per_unit(swept)`` continuations, each at the donor's suffix length). The probes are not in a ledger."""
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
            fixed = None  # what the ledger recorded and this run's work computes (cfg.work)
            if u.get("fixed") and item in fixed_head and cfg.computes("fixed"):
                fixed = (fixed_head[item], (_ids_len(u["fixed"]["replay"]["suffix"]),
                                            _ids_len(u["fixed"]["prefill"]["suffix"])))
            head, transplant = None, 0
            replica: int | None = 0
            conts: tuple[tuple[str, int], ...] = ()
            cs = u.get("constructions") or {}
            if u.get("reason") is None and cs:
                b = int(u["boundary"])
                head = p + b - 1
                rep = cs.get(LIVE_REPLICA.name)  # absent past the exact items (the ledger's config says how many)
                replica = (b + _ids_len(rep["suffix"]) if rep.get("logits_fp") else _ids_len(rep["suffix"])) if (
                    rep is not None and cfg.computes("replicas")) else None
                conts = tuple((k, _ids_len(c["suffix"])) for k, c in sorted(cs.items())
                              if k not in (LIVE.name, LIVE_REPLICA.name) and cfg.computes(k))
                if not cfg.computes("transplants"):
                    pass
                elif "transplant_tokens" in u and cfg.work is None:
                    transplant = int(u["transplant_tokens"])
                elif u.get("transplants"):  # recorded before transplant_tokens, or by a run of other work
                    guessed += 1
                    transplant = per_unit(spent < cfg.sweep_units) * _ids_len(cs["live"]["suffix"])
                spent += bool(u.get("transplants"))
            out[(item, d)] = Unit(p, _ids_len(u["generated"]), fixed, head, replica, conts, transplant,
                                  transplants=len(u.get("transplants") or {}) if transplant else 0)
    return out, guessed
