"""A cell's last steps, on the live and prefill boundary states it kept: the anatomy (which layers differ and
where the suffixes part) and, on divergent units, the transplants with their controls."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from pytest_kvaudit.engine import state as kv
from pytest_kvaudit.engine.decoder import Decoder, continue_greedy
from pytest_kvaudit.engine.pipeline import LIVE
from pytest_kvaudit.engine.records import DONOR, IDENTICAL, SHAM, CellRecord, Transplant
from pytest_kvaudit.engine.sweep import Subset
from pytest_kvaudit.engine.sweep import sweep as sweep_


class CellContext(Protocol):
    """What the anatomy and the transplants read of the cell being built (a :class:`.cells.CellBuilder` is one):
    the decoder, the transplant (a fault hook's, or the state's own) and the text of ids."""

    dec: Decoder
    transplant_fn: Callable[[Any, Any, Any, str], Any]

    def decode(self, ids: Sequence[int]) -> str: ...


def anatomy(b: CellContext, rec: CellRecord, live_state: Any, prefill_state: Any) -> None:
    if rec.unsupported is None:
        layers = kv.compare(live_state, prefill_state)
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

def transplants(b: CellContext, rec: CellRecord, live_state: Any, prefill_state: Any, last: int, budget: int,
                sweep: bool, controls: bool = True) -> None:
    """Donor following, both directions: all layers, and on the first divergent items the layer sweep (bisected,
    see :mod:`.sweep`: each direction's next subset depends on its last outcome, so they run in order);
    then the controls, which must leave each receiver's suffix as it was: a sham (the receiver's own
    cache handed to the transplant as donor) and, where the two states share bit-identical layers, a
    transplant of only those layers. On a model with recurrent state, the attention K/V alone and the
    recurrent state alone are transplanted too (the layer sweep's ``all:attn`` and ``all:recurrent`` rows).
    ``controls``: whether a selected claim reads the controls (donor_following does)."""
    states = {"live": live_state, "prefill": prefill_state}
    pairs = (("live", "prefill"), ("prefill", "live"))  # (donor, receiver)
    whole = {donor: transplant(b, rec, DONOR, states[receiver], states[donor], donor, receiver, None, "kv", last,
                               budget).followed for donor, receiver in pairs}
    if sweep:
        n_layers = len(kv.layers_of(live_state))
        for donor, receiver in pairs:
            def one(subset: Subset, donor: str = donor, receiver: str = receiver) -> bool:
                return transplant(b, rec, DONOR, states[receiver], states[donor], donor, receiver, subset[0],
                                  subset[1], last, budget, decide_only=True).followed
            sweep_(n_layers, whole[donor], one)
    for name in ("prefill", "live") if controls else ():
        # the same object as receiver and donor: the transplant path itself is what the sham tests
        transplant(b, rec, SHAM, states[name], states[name], name, name, None, "kv", last, budget)
    same = tuple(rec.comparison.identical_layers)
    if same and controls:
        for donor, receiver in pairs:
            transplant(b, rec, IDENTICAL, states[receiver], states[donor], donor, receiver, same, "kv", last, budget)
    if kv.recurrent(live_state):
        # the paper's question asked of a state the paper never had: does the attention K/V alone carry the
        # divergence, or the recurrent state? (an analysis beside the whole-state transplant the claim judges)
        for parts in ("attn", "recurrent"):
            for donor, receiver in pairs:
                transplant(b, rec, DONOR, states[receiver], states[donor], donor, receiver, None, parts, last, budget)

def transplant(b: CellContext, rec: CellRecord, kind: str, receiver: Any, donor: Any, donor_name: str, receiver_name: str,
               layers: tuple[int, ...] | None, parts: str, last: int, budget: int, decide_only: bool = False) -> Transplant:
    """One transplant -> continue -> compare with the donor's and the receiver's own suffixes (recorded, and
    returned: the sweep's next subset depends on it). ``decide_only`` (the sweep's points): stop decoding at the
    first token that departs from the donor's suffix, where "not followed" is decided; a receiver that follows
    decodes its whole suffix, as every other transplant does."""
    direction = f"{donor_name}_to_{receiver_name}"
    b.dec.path = f"transplant:{direction}" if kind == DONOR else (
        f"transplant:sham:{receiver_name}" if kind == SHAM else f"transplant:{kind}:{direction}")
    state = b.transplant_fn(receiver, donor, layers, parts)
    margins: list[float] = []
    target, own = rec.constructions[donor_name].suffix, rec.constructions[receiver_name].suffix
    suffix, _ = continue_greedy(b.dec, state, last, budget, margins, target if decide_only else None)
    t = Transplant(direction, layers, parts, suffix, suffix == target, kind, suffix == own,
                   tuple(round(m, 6) for m in margins), b.decode(suffix), decide_only and suffix != target)
    rec.transplants.append(t)
    return t
