"""The cell's steps, declared once: what each one computes, how it is priced, and which group it belongs to.

A cell (one item at one precision) is a fixed sequence of steps. :class:`~pytest_kvaudit.core.compute.cells.CellBuilder`
runs them, :mod:`pytest_kvaudit.core.cost.pricing` prices them (the plan's bound, a run's records, a recorded ledger)
and the claims' ``needs`` (:mod:`pytest_kvaudit.claims.needs`) name the groups they read, all from the declarations
below, so a new construction is one registered schedule (:func:`.schedules.register_schedule`) and nothing else.

The kinds of step and their price in forward calls and tokens, with ``P`` the prompt, ``G`` the generated
tokens, ``H`` the ids before the prefix's last (``P + b - 1``) and ``S`` the suffix:

* a *trajectory* (``live``, its replica): the prompt in one forward, then one token a forward:
  ``max(G, 1)`` calls, ``P + G - 1`` tokens;
* a *construction* (a boundary state over ``H`` ids in its chunk schedule, then ``S`` decode steps from
  ``prefix[-1]``): ``len(schedule) + S`` calls, ``H + S`` tokens;
* a *continuation* on a state already built (a transplant and its controls): ``S`` calls and tokens.

The groups are what a claim can need (``Claim.needs``): ``trajectory``, ``replicas``, ``constructions``
(or one construction by name: ``prefill``, ``incremental``, ``chunked(4)``...), ``fixed`` (the 2x2's own
cells), ``transplants`` and ``controls``. The layer sweep (``layer_sweep``) and the batch probe
(``batch_invariance``) are analyses: never in the least work the claims need, computed when a selected claim
quotes them (``Claim.analyses``), when ``--kvaudit-analyses`` names them or when every built-in claim runs.
A run's *work* (``AuditConfig.work``, :func:`work_of`) is what its selected claims need, closed over what
each step reads; None is everything. The constructions asked for by option (``--kvaudit-chunks``, a
registered schedule) or brought by the backend (llama.cpp's ``restore``) run in every run: ``incremental``,
the prefix-cache hits (``warm``), ``batched(B)`` and the replicas follow the claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from pytest_kvaudit.core.model.engine_protocol import Engine
from pytest_kvaudit.core.model.engines import ANALYSES, CAPABILITIES  # noqa: F401 (claims read)
from pytest_kvaudit.core.model.schedules import extra_constructions, runs_forwards, schedule


class RunSettings(Protocol):
    """What the pipeline reads of a run's settings (a :class:`.config.AuditConfig` is one), without importing
    the config: the config asks the pipeline what a run computes."""

    @property
    def work(self) -> tuple[str, ...] | None: ...
    @property
    def chunks(self) -> tuple[int, ...]: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def engine(self) -> Engine: ...
    @property
    def exact_items(self) -> int | None: ...

TRAJECTORY, CONSTRUCTION, CONTINUATION = "trajectory", "construction", "continuation"
#: the groups a claim may need, in the order the minimal-work breakdown lists them
GROUPS = ("trajectory", "replicas", "constructions", "fixed", "transplants", "controls")
REPLICA = ":replica"
#: computed in every run: eligibility, the divergence that picks the transplant units and every analysis
#: read the trajectory and the one-shot prefill
BASE = ("trajectory", "prefill")
# ANALYSES (a claim may read or quote them, computed when one does) and CAPABILITIES (the needs an engine may
# lack: the analyses and per-layer K/V) are declared with the engine record that lacks them (:mod:`.engines`)
#: the constructions that follow the claims (by name, before any ``(arg)``): the bridge, an engine's prefix-cache
#: hits (``warm``: the prefix_cache claim reads it) and vLLM's ``batched(B)``; every other one (a chunk schedule
#: asked for by option, llama.cpp's ``restore``) runs in every run
SELECTED = ("incremental", "warm", "batched")
#: the exact claims' own work (replica_exactness, bridge_bitexact): the replicas and the bridge's construction,
#: computed on every item or on the first ``--kvaudit-exact-items`` of the set (:func:`exact_item`)
EXACT_WORK = ("replicas", "incremental")
#: what each need reads besides itself: a control or a sweep runs on a unit with its transplants
IMPLIES = {"controls": ("transplants",), "layer_sweep": ("transplants",)}


@dataclass(frozen=True)
class Step:
    """One step of a cell. ``name`` is the record's key for what it computed and the path the fault hooks see."""

    name: str
    group: str
    kind: str
    #: a construction's chunk schedule (``prefill``, ``chunked(4)``, a user's ``halves``); ``live`` for a trajectory
    schedule: str = "live"
    #: the boundary state is kept after its continuation (the anatomy and the transplants read it)
    keep: bool = False
    #: the boundary state is compared layer by layer with the live one (the bridge)
    bridge: bool = False

    def price(self, prompt: int, length: int, suffix: int = 0) -> tuple[int, int]:
        """(calls, tokens): ``length`` is the trajectory's generated tokens, or the construction's head ``H``."""
        if self.kind == TRAJECTORY:
            return max(length, 1), prompt + max(length - 1, 0)
        if self.kind == CONSTRUCTION:
            if not runs_forwards(self.schedule):  # loaded, not computed: only its continuation runs
                return suffix, suffix
            calls = len(schedule(self.schedule, prompt, length)) if length >= 1 else 0
            return calls + suffix, length + suffix
        return suffix, suffix


LIVE = Step("live", "trajectory", TRAJECTORY)
LIVE_REPLICA = Step("live" + REPLICA, "replicas", TRAJECTORY)
#: the 2x2's own cells on the first precision's prefix ids (``CellRecord.fixed["replay"|"prefill"]``)
FIXED = (Step("fixed:replay", "fixed", CONSTRUCTION, "incremental"),
         Step("fixed:prefill", "fixed", CONSTRUCTION, "prefill"))
#: a transplant's continuation; its controls' (sham, identical layers); the layer sweep's
TRANSPLANT = Step("transplant", "transplants", CONTINUATION)
CONTROL = Step("control", "controls", CONTINUATION)
SWEEP = Step("sweep", "sweep", CONTINUATION)


def constructions(cfg: RunSettings, index: int | None = None) -> tuple[Step, ...]:
    """The constructions of a cell besides ``live`` that the run's work computes (:func:`all_constructions`,
    those its selected claims read), in the order they run and are recorded; for the item at ``index`` of the
    set, without the replicas and the bridge where it is past ``--kvaudit-exact-items`` (None: any item)."""
    exact = exact_item(cfg, index)
    return tuple(s for s in all_constructions(cfg) if computes(cfg.work, s.name) and (exact or not is_exact_work(s)))


def exact_item(cfg: RunSettings, index: int | None) -> bool:
    """Whether the item at ``index`` of the set gets the exact claims' own work (:data:`EXACT_WORK`): every item
    by default, the first ``cfg.exact_items`` when set. Those claims need a dozen units and find a difference in
    any one, while a replica and the bridge cost three of a cell's seven decodes: a long run may spend them on a
    declared head of the set and every other claim still reads every item."""
    n = cfg.exact_items
    return n is None or index is None or index < n


def is_exact_work(step: Step) -> bool:
    """A replica (live's or prefill's) or the bridge's construction."""
    return step.group == "replicas" or step.bridge


def replicates(cfg: RunSettings, index: int | None) -> bool:
    """Whether the item at ``index`` gets live's replica: a claim reads replicas and the item is exact work."""
    return computes(cfg.work, "replicas") and exact_item(cfg, index)


def exact_steps(cfg: RunSettings) -> tuple[str, ...]:
    """The names of the steps :data:`EXACT_WORK` covers in this run: live's replica, then the constructions."""
    return (LIVE_REPLICA.name, *(s.name for s in all_constructions(cfg) if is_exact_work(s)))


def all_constructions(cfg: RunSettings) -> tuple[Step, ...]:
    """Every construction of a cell besides ``live``, in the order they run and are recorded: ``prefill`` and
    its replica, ``incremental`` (the bridge), each registered schedule, each ``chunked(C)``, then the
    backend's own constructions (llama.cpp's ``warm`` and ``restore``, vLLM's ``warm`` and ``batched(B)`` with B
    the run's batch size; none for transformers)."""
    names = ("incremental", *extra_constructions(), *(f"chunked({c})" for c in cfg.chunks),
             *cfg.engine.constructions_at(cfg.batch_size))
    return (Step("prefill", "constructions", CONSTRUCTION, "prefill", keep=True),
            Step("prefill" + REPLICA, "replicas", CONSTRUCTION, "prefill"),
            *(Step(n, "constructions", CONSTRUCTION, n, bridge=n == "incremental") for n in names))


def computes(work: Iterable[str] | None, what: str) -> bool:
    """Whether a run of ``work`` (None: everything) computes ``what``: a group, an analysis or a construction
    (a named construction is in ``constructions``; a replica, live's or prefill's, in ``replicas``)."""
    if work is None or what in BASE:
        return True
    w = set(work)
    if what.endswith(REPLICA):
        return "replicas" in w
    if what in GROUPS or what in CAPABILITIES:
        return what in w
    return what.split("(")[0] not in SELECTED or what in w or "constructions" in w


def work_of(needs: Iterable[str]) -> tuple[str, ...]:
    """The work a set of needs asks for: the needs, what they imply and the base, sorted (a config field
    every process of a run must agree on)."""
    out = set(BASE)
    for n in needs:
        out.add(n)
        out.update(IMPLIES.get(n, ()))
    return tuple(sorted(out))


def unknown_needs(needs: Iterable[str], cfg: RunSettings) -> list[str]:
    """Needs that name nothing this run computes: not a group, analysis or construction of ``cfg``."""
    names = {s.name for s in all_constructions(cfg)}
    return [n for n in needs if n not in GROUPS and n not in CAPABILITIES and n not in names]


def lacked(engine: Engine, needs: Iterable[str]) -> list[str]:
    """The needs that ``engine`` cannot compute (llama.cpp's state is read whole: no layers to sweep)."""
    return [n for n in needs if n in CAPABILITIES and n in engine.lacks]


def cell_steps(cfg: RunSettings) -> tuple[Step, ...]:
    """The whole cell, top to bottom: the trajectory, its replica, the constructions, the 2x2's cells."""
    return (LIVE, LIVE_REPLICA, *constructions(cfg), *FIXED)


def step_named(name: str) -> Step:
    """The step a record's construction key names (``prefill:replica``, ``chunked(4)``, ``halves``): its
    schedule is the name without ``:replica``. Works on records of any run, whatever was registered there."""
    if name == LIVE.name:
        return LIVE
    if name == LIVE_REPLICA.name:
        return LIVE_REPLICA
    base = name[: -len(REPLICA)] if name.endswith(REPLICA) else name
    group = "replicas" if name.endswith(REPLICA) else "constructions"
    return Step(name, group, CONSTRUCTION, base, keep=name == "prefill", bridge=name == "incremental")


# -- the groups on a computed record: what the claims' least work is priced on -------------------------------
def replica_generated(r: Any) -> int:
    """The replica trajectory's generated tokens: a replica that reached the same boundary records its suffix
    only, one that did not records its whole generation."""
    rep = r.constructions.get(LIVE_REPLICA.name)
    if rep is None:  # not computed: no claim of the run read replicas
        return 0
    return int(r.boundary) + len(rep.suffix) if rep.logits_fp else len(rep.suffix)


def group_continuations(r: Any, group: str) -> Iterator[tuple[Step, int]]:
    """``(step, suffix length)`` for each construction of ``group`` that record ``r`` holds."""
    for name, c in r.constructions.items():
        s = step_named(name)
        if s.kind == CONSTRUCTION and s.group == group:
            yield s, len(c.suffix)


# -- a request-level engine's records: each request's forward tokens as the engine counted them ----------------
#: the requests a request-level engine runs inside its ``warm`` step besides the partial hit (vLLM's whole-block
#: hit, and the cross-request hit with the request that writes its blocks): their cost is ``warm``'s
WARM_REQUESTS = ("warm:block", "cross", "cross:writer")


def request_owner(name: str) -> tuple[str, str | None]:
    """(group, construction) whose cost a request named ``name`` is: ``live`` the trajectory's, the replicas',
    the 2x2's, a transplant's (its controls': sham and identical-layer paths) or a construction's (a fault's
    re-run, ``X:faulted``, is X's; the prefix cache's other hits are ``warm``'s)."""
    if name == LIVE.name:
        return "trajectory", None
    if name.endswith(REPLICA):
        return "replicas", None
    if name.startswith("fixed:"):
        return "fixed", None
    if name.startswith("transplant:"):
        return ("controls" if name.split(":")[1] in ("sham", "identical") else "transplants"), None
    base = name.removesuffix(":faulted")
    return "constructions", "warm" if base in WARM_REQUESTS else base


def request_costs(r: Any) -> dict[str, tuple[int, int]]:
    """``{request name: (calls, tokens)}`` a request-level engine recorded on ``r`` (``requests[name]["cost"]``:
    what it counted, every request of the step included, e.g. ``batched(B)``'s others); empty for a record of
    a forward-level engine, whose work is priced from its lengths."""
    return {k: (int(v["cost"][0]), int(v["cost"][1])) for k, v in getattr(r, "requests", {}).items() if "cost" in v}


def _requested(r: Any, group: str, construction: str | None = None) -> int:
    """Tokens of ``r``'s requests owned by ``group`` (by ``construction`` of it, when one is named)."""
    owners = {name: request_owner(name) for name in request_costs(r)}
    return sum(t for name, (_, t) in request_costs(r).items()
               if owners[name][0] == group and construction in (None, owners[name][1]))


def construction_tokens(r: Any, name: str) -> int:
    """Forward tokens record ``r`` spent on the construction ``name`` (0 where it did not compute it)."""
    c = r.constructions.get(name)
    if r.error or not r.eligible or c is None or step_named(name).kind != CONSTRUCTION:
        return 0
    if request_costs(r):
        return _requested(r, "constructions", name) if step_named(name).group == "constructions" else 0
    return step_named(name).price(len(r.prompt_ids), len(r.prefix) - 1, len(c.suffix))[1]


def group_tokens(r: Any, group: str, transplants: Iterable[Any] = ()) -> int:
    """Forward tokens record ``r`` spent on ``group`` (``transplants``: those of its transplants to count)."""
    if r.error:
        return 0
    if request_costs(r):  # a request-level engine: what it counted (controls and transplants by their paths)
        return 0 if group != "trajectory" and group != "fixed" and not r.eligible else _requested(r, group)
    if group == "trajectory":
        return LIVE.price(len(r.prompt_ids), len(r.generated))[1]
    if group == "fixed":
        head = (r.fixed_prefix_len or 0) - 1
        return sum(step.price(len(r.prompt_ids), head, len(r.fixed[step.name.split(":")[1]].suffix))[1]
                   for step in FIXED if r.fixed)
    if group in ("transplants", "controls"):
        return sum(len(t.suffix) for t in transplants)
    if not r.eligible:
        return 0
    head = len(r.prefix) - 1
    tokens = sum(s.price(len(r.prompt_ids), head, n)[1] for s, n in group_continuations(r, group))
    if group == "replicas" and LIVE_REPLICA.name in r.constructions:
        tokens += LIVE_REPLICA.price(len(r.prompt_ids), replica_generated(r))[1]
    return tokens
