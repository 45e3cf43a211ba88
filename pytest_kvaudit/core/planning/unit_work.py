"""The plan's model of one unit's work (one item at one precision): every declared price added up, the cell's
steps (:mod:`pytest_kvaudit.core.model.pipeline`), the transplant stages
(:data:`pytest_kvaudit.core.compute.transplants.STAGES`) and the probes
(:mod:`pytest_kvaudit.core.compute.probes`), so a new step, stage or probe is priced where it is written."""

from __future__ import annotations

from pytest_kvaudit.core.compute import probes
from pytest_kvaudit.core.compute.transplants import Switches, continuations
from pytest_kvaudit.core.cost.pricing import Lengths, add
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import FIXED, LIVE, LIVE_REPLICA, TRANSPLANT, constructions, replicates


def transplants_per_unit(cfg: AuditConfig, sweep: bool, n_layers: int, recurrent: bool = False) -> int:
    """Transplant continuations on one divergent unit of this run, at most (the stages' declared prices)."""
    return continuations(Switches(sweep, cfg.computes("controls"), recurrent), n_layers)


def work(x: Lengths, cfg: AuditConfig, primary: Lengths | None, donor: bool, sweep: bool, n_layers: int,
         batch_width: int | None = None, recurrent: bool = False, index: int | None = None) -> dict[str, list[int]]:
    """``{step: [cells, calls, tokens]}`` for one item at one precision; ``primary`` is the first precision's
    lengths (its prefix fixes the 2x2's ids), ``donor``/``sweep`` whether this unit gets transplants (it is
    divergent and within the donor units) and the layer sweep, ``batch_width`` the batch probe's width,
    ``index`` the item's place in the set (the exact claims' work may stop short of it; None: it gets it)."""
    acc: dict[str, list[int]] = {}
    add(acc, LIVE.name, *LIVE.price(x.prompt, x.gen))
    if primary is not None and primary.eligible and cfg.computes("fixed"):
        # the 2x2's own cells on the first precision's prefix (also where this precision is ineligible)
        fixed_head = primary.prompt + primary.boundary - 1
        s = x.suffix if x.eligible else primary.suffix
        for step in FIXED:
            add(acc, step.group, *step.price(x.prompt, fixed_head, s))
    if not x.eligible:
        return acc
    head = x.prompt + x.boundary - 1
    if replicates(cfg, index):
        add(acc, LIVE_REPLICA.name, *LIVE_REPLICA.price(x.prompt, x.gen))
    priced = cfg.engine.price_under(cfg.engine_args) or (lambda *_: None)
    budget = x.budget if x.budget is not None else x.suffix
    for step in constructions(cfg, index):  # those the run's work computes
        own = priced(step.name, x.prompt, head, x.suffix, budget)
        add(acc, step.name, *(own or step.price(x.prompt, head, x.suffix)))
    if donor and cfg.computes("transplants"):
        own = priced(TRANSPLANT.name, x.prompt, head, x.suffix, budget)
        for _ in range(transplants_per_unit(cfg, sweep, n_layers, recurrent)):
            add(acc, "transplants", *(own or TRANSPLANT.price(0, 0, x.suffix)))
    if batch_width is not None:
        add(acc, "batch_invariance", *probes.batch_price(cfg, head, batch_width))
    for attn in cfg.attn_axes:
        for calls, tokens in probes.attention_price(x.prompt, head, x.suffix, x.gen):
            add(acc, f"axis:{attn}", calls, tokens)
    for kind in cfg.cache_axes:
        for calls, tokens in probes.cache_probe_price(kind)(x.prompt, head, x.suffix, x.gen):
            add(acc, f"cache:{kind}", calls, tokens)
    return acc
