"""The layer sweep, bisected: the fewest transplants that find, per unit and direction, the smallest bottom
and top layer sets whose K/V make a receiver follow its donor.

Trying every single layer and every bottom-j and top-j prefix costs about ``3n`` transplants each way on an
``n``-layer model (88 subsets on 30 layers): on SmolLM2-135M that made a run cost 2.32x the forward tokens
the claims need, for an analysis no claim needs. Follow is assumed monotone in ``j`` (more of the donor's
layers never make the receiver stop following), so a binary search finds the smallest sufficient ``j`` in
``ceil(log2 n)`` transplants. The ends are known without a new transplant: ``j = 0`` is the receiver's own
cache, whose suffix differs from the donor's on a divergent unit, and ``j = n`` is the all-layer transplant
that donor_following makes anyway. The search keeps "lo does not follow, hi follows", both observed (or
those two ends), so even where follow is not monotone the ``j`` it returns follows and ``j - 1`` does not.

Every tried subset is a real transplant, recorded as such; the analysis infers the untried ``j`` from
monotonicity and says so. The next subset depends on the last outcome, so a unit's sweep decodes in order.

Single layers: all of them when the model has at most :data:`SINGLES_UP_TO` layers (cheap there, and what a
2-to-8-layer model is usually audited for); otherwise none beyond the searches' own ``j = 1`` points (layer
0 and layer ``n - 1``), since ``n`` singles each way would cost more than the search saves.

Pure: no torch, no pytest; :mod:`pytest_kvaudit.core.compute.transplants` runs it with a real transplant as ``follows``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

#: (layers, parts): ``None`` = all layers; parts ``kv``, ``k`` or ``v``
Subset = tuple[tuple[int, ...] | None, str]

#: models with at most this many layers get every single layer swept too
SINGLES_UP_TO = 8
#: the whole-cache rows kept beside the searches: all layers' K only, all layers' V only
PART_ROWS: tuple[Subset, ...] = ((None, "k"), (None, "v"))


def bottom(j: int, n_layers: int) -> tuple[int, ...]:
    """The first ``j`` layers."""
    return tuple(range(j))


def top(j: int, n_layers: int) -> tuple[int, ...]:
    """The last ``j`` layers."""
    return tuple(range(n_layers - j, n_layers))


def smallest_following(n_layers: int, follows: Callable[[int], bool]) -> int:
    """The smallest ``j`` in ``1..n_layers`` with ``follows(j)``, given that ``j = 0`` does not follow and
    ``j = n_layers`` does (neither is asked). Calls ``follows`` at most :func:`search_tries` times, each ``j``
    at most once; ``follows(j)`` is true and ``follows(j - 1)`` false (or ``j = 1``) for the ``j`` returned."""
    lo, hi = 0, n_layers
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if follows(mid):
            hi = mid
        else:
            lo = mid
    return hi


def search_tries(n_layers: int) -> int:
    """The most transplants one search makes: the interval ``(0, n]`` halves with each."""
    return math.ceil(math.log2(n_layers)) if n_layers > 1 else 0


def singles(n_layers: int) -> list[Subset]:
    """The single-layer rows swept beside the searches (see the module's policy)."""
    return [((i,), "kv") for i in range(n_layers)] if n_layers <= SINGLES_UP_TO else []


def sweep_tries_max(n_layers: int) -> int:
    """An upper bound on the sweep's transplants in one direction on one unit, for the plan: two searches,
    the K-only and V-only rows, and the single layers (some of which the searches may already have tried)."""
    return 2 * search_tries(n_layers) + len(PART_ROWS) + len(singles(n_layers))


def sweep(n_layers: int, whole_followed: bool, transplant: Callable[[Subset], bool]) -> dict[str, int | None]:
    """One direction's sweep on one unit: the bottom and top searches (only when the all-layer transplant
    was followed: otherwise no ``j`` is sufficient and nothing is searched), the K-only/V-only rows and the
    single layers, each subset transplanted at most once. ``transplant(subset)`` makes and records the
    transplant and says whether the receiver followed. Returns the smallest bottom and top ``j`` found."""
    seen: dict[Subset, bool] = {}

    def once(subset: Subset) -> bool:
        if subset not in seen:
            seen[subset] = transplant(subset)
        return seen[subset]

    found: dict[str, int | None] = {"bottom": None, "top": None}
    if whole_followed and n_layers:
        found["bottom"] = smallest_following(n_layers, lambda j: once((bottom(j, n_layers), "kv")))
        found["top"] = smallest_following(n_layers, lambda j: once((top(j, n_layers), "kv")))
    for subset in (*PART_ROWS, *singles(n_layers)):
        once(subset)
    return found
