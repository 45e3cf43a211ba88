"""The least forward tokens the claims need, priced apart from the forwards actually run.

``Cost.forward_tokens`` counts what the decoder ran. This module prices what the claims *need*, from the
plan (which cells each claim reads) and the lengths the records show (prompt, boundary, suffix), with the
token counts each schedule implies: a trajectory is its prompt in one forward plus one forward per
generated token but the last; a construction is ``prefix[:-1]`` in its chunks plus one forward per suffix
token (``prefix[-1]`` first); a transplant is one forward per suffix token on a state already built.

Per eligible item and precision: the trajectory, the replicas that replica_exactness compares (live and
prefill), each construction (prefill, incremental, chunked(c)), the 2x2's two cells on the fixed prefix,
and, on the units donor_following judges, the two all-layer transplants and the controls. The 2x2's
cells at an ineligible precision count too. Work that only analyses read (the layer sweep, the attention
axes, batch invariance) and work done twice by mistake are not in it, so ``forward_tokens /
minimal_forward_tokens`` is the honest overhead.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PARTS = ("trajectories", "replicas", "constructions", "fixed_prefix_2x2", "transplants", "controls")


def trajectory_tokens(prompt_len: int, generated: int) -> int:
    return prompt_len + max(0, generated - 1)


def replica_tokens(r: Any) -> int:
    rep = r.constructions["live:replica"]
    if rep.logits_fp:  # it reached the same boundary: the record holds its suffix only
        return trajectory_tokens(len(r.prompt_ids), r.boundary + len(rep.suffix))
    return trajectory_tokens(len(r.prompt_ids), len(rep.suffix))  # the record holds the whole generation


def construction_tokens(prefix_len: int, suffix_len: int) -> int:
    return prefix_len - 1 + suffix_len


def minimal_tokens(records: Iterable[Any], donor_max_units: int, primary_dtype: str | None = None) -> dict[str, int]:
    """Forward tokens per kind of work the claims need, over ``records`` (a store's, in item order)."""
    from pytest_kvaudit.claims.donor_following import donor_units

    recs = [r for r in records if not r.error]
    parts = dict.fromkeys(PARTS, 0)
    prefix_len = {r.item_id: len(r.prefix) for r in recs if r.dtype == primary_dtype and r.eligible}
    for r in recs:
        parts["trajectories"] += trajectory_tokens(len(r.prompt_ids), len(r.generated))
        if r.fixed:
            fl = r.fixed_prefix_len or prefix_len.get(r.item_id, 0)
            parts["fixed_prefix_2x2"] += sum(construction_tokens(fl, len(c.suffix)) for c in r.fixed.values())
        if not r.eligible:
            continue
        p = len(r.prefix)
        parts["replicas"] += replica_tokens(r) + construction_tokens(p, len(r.constructions["prefill:replica"].suffix))
        parts["constructions"] += sum(construction_tokens(p, len(c.suffix)) for name, c in r.constructions.items()
                                      if name not in ("live", "live:replica", "prefill:replica"))
    for r in donor_units(recs, donor_max_units):
        parts["transplants"] += sum(len(t.suffix) for t in r.whole_transplants())
        parts["controls"] += sum(len(t.suffix) for t in r.transplants if t.kind != "donor")
    return parts
