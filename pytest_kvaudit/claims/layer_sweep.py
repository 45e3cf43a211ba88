"""The layer sweep as an analysis: which transplanted layer sets make a receiver follow its donor.

The engine bisects (:mod:`pytest_kvaudit.core.model.sweep`): per swept unit and direction it tries about
``2 log2 n`` bottom-``j`` and top-``j`` layer sets, K only, V only, and single layers on small models. The
table holds only those tried subsets, each with the counts it was tried on. The curves (follow rate against
the number of layers transplanted from the bottom / from the top) need every ``j``: a pair's value at an
untried ``j`` is inferred from monotonicity (followed at some ``j' <= j`` -> follows; not followed at some
``j' >= j`` -> does not), and each point counts how many of its
values were tried and how many inferred. Descriptive, not a claim: which layers carry the divergence.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_kvaudit.claims.stats import wilson_interval
from pytest_kvaudit.core.model.sweep import bottom, top

DIRECTIONS = ("live_to_prefill", "prefill_to_live")
#: the table's order of parts: whole K/V sets first, then K only, V only, and a hybrid's attention/recurrent
PART_ORDER = {"kv": 0, "k": 1, "v": 2, "attn": 3, "recurrent": 4}
INFERENCE_NOTE = ("curves: at each j, 'tried' pairs were transplanted with exactly the bottom/top j layers; the "
                  "others are 'inferred' from monotonicity (a pair that followed with fewer layers follows, one "
                  "that did not with more layers does not); 'unknown' "
                  "where its tried points contradict monotonicity. The all-layer point (j = n) is the all-layer "
                  "transplant.")


def label(layers: tuple[int, ...] | list[int] | None, parts: str) -> str:
    """A subset's name in the report: ``0,1,2:kv``, ``all:k``."""
    where = "all" if layers is None else ",".join(map(str, layers))
    return f"{where}:{parts}"


def layers_text(layers: Iterable[int] | None) -> str:
    """Layers as runs for people (``0-14``, ``3, 7-9``; ``all``): an 80-layer bottom set spelled out in full is
    unreadable. The report's ``subset`` keys stay the full list."""
    if layers is None:
        return "all"
    runs: list[list[int]] = []
    for x in sorted(layers):
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    return ", ".join(str(a) if a == b else f"{a}\u2013{b}" for a, b in runs)


def _donor(t: Any) -> bool:  # the controls (sham, identical layers) are donor_following's, not the sweep's
    return getattr(t, "kind", "donor") == "donor"


def _n_layers(r: Any) -> int:
    seen = [max(t.layers) + 1 for t in r.transplants if t.layers]
    return max([len(r.drift), *seen], default=0)


def _points(ts: list[Any], n: int) -> tuple[dict[int, bool], dict[int, bool]]:
    """One (unit, direction)'s tried points: j -> followed, from the bottom and from the top."""
    up: dict[int, bool] = {}
    down: dict[int, bool] = {}
    for t in ts:
        if t.parts != "kv":
            continue
        if t.layers is None:
            up[n] = down[n] = t.followed
            continue
        j = len(t.layers)
        if tuple(t.layers) == bottom(j, n):
            up[j] = t.followed
        if tuple(t.layers) == top(j, n):
            down[j] = t.followed
    return up, down


def _value(points: dict[int, bool], j: int) -> tuple[bool | None, bool]:
    """(follows at ``j``, tried): tried, or inferred from monotonicity, or None where the points contradict it."""
    if j in points:
        return points[j], True
    yes = any(f for i, f in points.items() if i <= j)
    no = any(not f for i, f in points.items() if i >= j)
    return (None if yes == no else yes), False


def _curve(pairs: list[dict[int, bool]], n: int) -> list[dict[str, Any]]:
    out = []
    for j in range(1, n + 1):
        vals = [_value(p, j) for p in pairs]
        known = [v for v, _ in vals if v is not None]
        tried = sum(t for _, t in vals)
        out.append({"layers": j, "followed": sum(known), "known": len(known), "tried": tried,
                    "inferred": len(known) - tried, "unknown": len(vals) - len(known),
                    "rate": sum(known) / len(known) if known else None})
    return out


def _minimal(points: dict[int, bool], n: int) -> int | None:
    """The smallest tried ``j`` that followed; None when the all-layer transplant itself was not followed."""
    if not points.get(n):
        return None
    return min(j for j, f in points.items() if f)


def _order(row: dict[str, Any], n: int) -> tuple[int, int, int]:
    """Numeric order: parts, then size (all layers last), then first layer (never the subset's string)."""
    layers = row["layers"]
    return (PART_ORDER.get(row["parts"], len(PART_ORDER)), n + 1 if layers is None else len(layers),
            -1 if not layers else layers[0])


def layer_sweep(records: Iterable[Any], max_units: int | None = None) -> dict[str, Any]:
    """The sweep on the swept units (the first ``max_units`` divergent items in item order): per tried subset
    the share of receivers that follow their donor; per unit and direction the smallest bottom and top ``j``
    found; the follow-rate curves over ``j``; single layers where tried; and the subsets sufficient on every
    swept (unit, direction), the smallest of them ``minimal_sufficient``."""
    units = [r for r in records if r.eligible and any(_donor(t) and not t.whole for t in r.transplants)]
    if max_units is not None:
        units = units[:max_units]
    n_layers = max((_n_layers(r) for r in units), default=0)
    table: dict[str, dict[str, Any]] = {}
    minimal: list[dict[str, Any]] = []
    ups: list[dict[int, bool]] = []
    downs: list[dict[int, bool]] = []
    for r in units:
        donors = [t for t in r.transplants if _donor(t)]
        for t in donors:
            row = table.setdefault(label(t.layers, t.parts), {
                "layers": None if t.layers is None else list(t.layers), "parts": t.parts,
                "live_to_prefill": [0, 0], "prefill_to_live": [0, 0]})
            row[t.direction][0] += int(t.followed)
            row[t.direction][1] += 1
        for d in DIRECTIONS:
            ts = [t for t in donors if t.direction == d]
            if not ts:
                continue
            up, down = _points(ts, n_layers)
            ups.append(up)
            downs.append(down)
            minimal.append({"unit": f"{r.item_id}@{r.dtype}", "direction": d, "bottom": _minimal(up, n_layers),
                            "top": _minimal(down, n_layers), "tried": sum(not t.whole for t in ts)})
    rows = []
    for key, row in table.items():
        k = row["live_to_prefill"][0] + row["prefill_to_live"][0]
        n = row["live_to_prefill"][1] + row["prefill_to_live"][1]
        row.update(subset=key, follow_rate=k / n if n else 0.0, wilson=list(wilson_interval(k, n)),
                   size=(len(row["layers"]) if row["layers"] is not None else None), on_every_unit=n == len(minimal))
        rows.append(row)
    rows.sort(key=lambda r: _order(r, n_layers))
    sufficient = [r for r in rows if r["follow_rate"] == 1.0 and r["parts"] == "kv" and r["on_every_unit"]]
    best = sufficient[0] if sufficient else None  # rows are in (size, first layer) order already

    def common(side: str) -> int | None:
        js = [m[side] for m in minimal]
        return None if not js or None in js else max(js)

    singles: dict[int, list[int]] = {}
    for row in rows:
        if row["parts"] == "kv" and row["layers"] is not None and len(row["layers"]) == 1:
            singles[row["layers"][0]] = [row["live_to_prefill"][0] + row["prefill_to_live"][0],
                                         row["live_to_prefill"][1] + row["prefill_to_live"][1]]
    return {"units": [f"{r.item_id}@{r.dtype}" for r in units], "n_layers": n_layers, "subsets": rows,
            "sufficient": [r["subset"] for r in sufficient],
            "minimal_sufficient": None if best is None else {"subset": best["subset"], "layers": best["layers"]},
            "minimal": minimal,
            # the smallest bottom (top) j every pair follows with: its own j for the pair that needs the most,
            # inferred from monotonicity for the others
            "sufficient_bottom": common("bottom"), "sufficient_top": common("top"),
            "curves": {"from_bottom": _curve(ups, n_layers), "from_top": _curve(downs, n_layers),
                       "note": INFERENCE_NOTE},
            "singles": [{"layer": i, "followed": k, "n": n} for i, (k, n) in sorted(singles.items())]}
