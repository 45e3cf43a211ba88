"""A cell's last steps, on the live and prefill boundary states it kept: the anatomy (which layers differ and
where the suffixes part) and, on divergent units, the transplants with their controls."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_kvaudit.core.model.pipeline import LIVE
from pytest_kvaudit.core.model.records import DONOR, IDENTICAL, SHAM, CellRecord, Transplant
from pytest_kvaudit.core.model.sweep import Subset, sweep_tries_max
from pytest_kvaudit.core.model.sweep import sweep as sweep_
from pytest_kvaudit.core.runtime.decoder import Decoder, continue_greedy


class CellContext(Protocol):
    """What the anatomy and the transplants read of the cell being built (a :class:`.cells.CellBuilder` is one):
    the decoder, the transplant (a fault hook's, or the state's own) and the text of ids."""

    dec: Decoder
    transplant_fn: Callable[[Any, Any, Any, str], Any]
    #: what reads the engine's states (its record's ``state_reader``: compare, layers_of, recurrent, ...)
    kv: Any

    def decode(self, ids: Sequence[int]) -> str: ...


def anatomy(b: CellContext, rec: CellRecord, live_state: Any, prefill_state: Any) -> None:
    if rec.unsupported is None:
        layers = b.kv.compare(live_state, prefill_state)
        # an engine's whole state says only equal or not: no magnitude to put in the drift
        rec.comparison.drift = [[c.layer, c.keys_max_abs, c.values_max_abs, c.keys_rel, c.values_rel]
                                for c in layers if math.isfinite(c.keys_max_abs + c.values_max_abs)]
        rec.comparison.differing_layers = [c.layer for c in layers if not (c.keys_equal and c.values_equal)]
        rec.comparison.identical_layers = [c.layer for c in layers if c.keys_equal and c.values_equal]
    live, prefill = rec.constructions[LIVE.name].suffix, rec.constructions["prefill"].suffix
    if live != prefill:
        j = next((i for i, (a, b) in enumerate(zip(live, prefill)) if a != b), None)
        if j is not None:
            rec.comparison.divergence_text = [b.decode([live[j]]), b.decode([prefill[j]])]

@dataclass(frozen=True)
class Switches:
    """What decides which transplant stages run on a divergent unit: the layer sweep (the first
    ``--kvaudit-sweep-units`` divergent units), the controls (when a selected claim reads them) and whether the
    model carries a recurrent state."""

    sweep: bool = False
    controls: bool = True
    recurrent: bool = False


@dataclass(frozen=True)
class Move:
    """One transplant asked of a unit: what kind (donor, sham, identical), from which boundary state to which
    (``"live"``, ``"prefill"``), which layers (None: all) and parts (``kv``, ``k``, ``v``, ``attn``,
    ``recurrent``), and whether to stop at the first token that departs from the donor (the sweep's points)."""

    kind: str
    donor: str
    receiver: str
    layers: tuple[int, ...] | None = None
    parts: str = "kv"
    decide_only: bool = False


@dataclass
class _Unit:
    """One divergent unit's transplants under way: the two boundary states and what the stages share."""

    b: CellContext
    rec: CellRecord
    states: dict[str, Any]
    last: int
    budget: int
    whole: dict[str, bool] = field(default_factory=dict)

    def move(self, kind: str, donor: str, receiver: str, layers: tuple[int, ...] | None = None, parts: str = "kv",
             decide_only: bool = False) -> Transplant:
        return transplant(self, Move(kind, donor, receiver, layers, parts, decide_only))


#: (donor, receiver): both directions
PAIRS = (("live", "prefill"), ("prefill", "live"))


def _whole(u: _Unit) -> None:
    """Donor following: every layer's K/V, both ways (what the claim judges)."""
    for donor, receiver in PAIRS:
        u.whole[donor] = u.move(DONOR, donor, receiver).followed


def _sweep(u: _Unit) -> None:
    """The layer sweep, bisected (:mod:`pytest_kvaudit.core.model.sweep`): each direction's next subset depends
    on its last outcome, so they run in order."""
    n_layers = len(u.b.kv.layers_of(u.states["live"]))
    for donor, receiver in PAIRS:
        def one(subset: Subset, donor: str = donor, receiver: str = receiver) -> bool:
            return u.move(DONOR, donor, receiver, subset[0], subset[1], decide_only=True).followed
        sweep_(n_layers, u.whole[donor], one)


def _shams(u: _Unit) -> None:
    """A control: the receiver's own cache handed to the transplant as donor (the transplant path itself is
    what the sham tests), which must leave its suffix as it was."""
    for name in ("prefill", "live"):
        u.move(SHAM, name, name)


def _identical(u: _Unit) -> None:
    """A control: only the layers the two states share bit for bit, both ways (none where none are shared)."""
    same = tuple(u.rec.comparison.identical_layers)
    for donor, receiver in PAIRS if same else ():
        u.move(IDENTICAL, donor, receiver, same)


def _parts(u: _Unit) -> None:
    """On a model with recurrent state, the paper's question asked of a state the paper never had: does the
    attention K/V alone carry the divergence, or the recurrent state? (the sweep's ``all:attn`` and
    ``all:recurrent`` rows, beside the whole-state transplant the claim judges)"""
    for parts in ("attn", "recurrent"):
        for donor, receiver in PAIRS:
            u.move(DONOR, donor, receiver, None, parts)


@dataclass(frozen=True)
class Stage:
    """One stage of the transplants on a divergent unit: when it runs, what it runs, and its price: how many
    continuations it runs at most (each one decodes the unit's suffix, one token a call). The plan prices the
    transplants from these declarations (:func:`continuations`), so the price cannot drift from the code."""

    name: str
    runs: Callable[[Switches], bool]
    run: Callable[[_Unit], None]
    price: Callable[[Switches, int], int]  # (switches, number of layers) -> continuations, at most


STAGES = (
    Stage("whole", lambda s: True, _whole, lambda s, n: 2),
    # its bisection stops where the outcomes say, so its price is its bound, ceil(log2 n) tries a search
    Stage("sweep", lambda s: s.sweep, _sweep, lambda s, n: 2 * sweep_tries_max(n)),
    Stage("shams", lambda s: s.controls, _shams, lambda s, n: 2),
    Stage("identical", lambda s: s.controls, _identical, lambda s, n: 2),  # at most: none without shared layers
    Stage("parts", lambda s: s.recurrent, _parts, lambda s, n: 4),
)


def continuations(s: Switches, n_layers: int) -> int:
    """The transplant continuations on one divergent unit under ``s``, at most: the stages' declared prices."""
    return sum(st.price(s, n_layers) for st in STAGES if st.runs(s))


def transplants(b: CellContext, rec: CellRecord, live_state: Any, prefill_state: Any, last: int, budget: int,
                sweep: bool, controls: bool = True) -> None:
    """Donor following, both directions, then the stages that follow it (:data:`STAGES`, in order): the layer
    sweep on the first divergent items, the controls (which must leave each receiver's suffix as it was) and,
    on a model with recurrent state, the attention K/V and the recurrent state apart. ``controls``: whether a
    selected claim reads the controls (donor_following does)."""
    u = _Unit(b, rec, {"live": live_state, "prefill": prefill_state}, last, budget)
    s = Switches(sweep, controls, b.kv.recurrent(live_state))
    for stage in STAGES:
        if stage.runs(s):
            stage.run(u)


def transplant(u: _Unit, move: Move) -> Transplant:
    """One transplant on unit ``u`` -> continue -> compare with the donor's and the receiver's own suffixes
    (recorded, and returned: the sweep's next subset depends on it). ``move.decide_only`` (the sweep's points):
    stop decoding at the first token that departs from the donor's suffix, where "not followed" is decided; a
    receiver that follows decodes its whole suffix, as every other transplant does."""
    b, rec, kind, layers, parts, decide_only = u.b, u.rec, move.kind, move.layers, move.parts, move.decide_only
    donor_name, receiver_name = move.donor, move.receiver
    direction = f"{donor_name}_to_{receiver_name}"
    b.dec.path = f"transplant:{direction}" if kind == DONOR else (
        f"transplant:sham:{receiver_name}" if kind == SHAM else f"transplant:{kind}:{direction}")
    state = b.transplant_fn(u.states[receiver_name], u.states[donor_name], layers, parts)
    margins: list[float] = []
    target, own = rec.constructions[donor_name].suffix, rec.constructions[receiver_name].suffix
    suffix, _ = continue_greedy(b.dec, state, u.last, u.budget, margins, target if decide_only else None)
    t = Transplant(direction, layers, parts, suffix, suffix == target, kind, suffix == own,
                   tuple(round(m, 6) for m in margins), b.decode(suffix), decide_only and suffix != target)
    rec.transplants.append(t)
    return t
