"""Two ledgers of the same items, token for token: which trajectories moved and which divergent sets changed.

A count can hold while the items behind it change (5/24 divergent suffixes at checkpoint N and at N+1, with
sum-004 and sum-021 replaced by sum-009 and sum-016): the gate therefore compares the sets and every item's
greedy trajectory, not only the counts, and names the item, the precision and the first token where the
trajectories part. Pure data over :mod:`pytest_kvaudit.core.cost.ledger` documents, no pytest.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.core.planning.baseline import Rules

#: how many changed trajectories a diff keeps per precision (the count is always whole)
KEEP = 200


def _eligible(u: Mapping[str, Any]) -> bool:
    c = u.get("constructions") or {}
    return u.get("reason") is None and "live" in c and "prefill" in c


def _sets(units: Mapping[str, Any], dtype: str) -> tuple[int, list[str], list[str]]:
    """(eligible items, divergent items, items whose label changed) of one ledger at one precision."""
    n, div, lab = 0, [], []
    for name, u in units.items():
        item, _, d = name.rpartition("@")
        if d != dtype or not _eligible(u):
            continue
        n += 1
        live, pre = u["constructions"]["live"], u["constructions"]["prefill"]
        if live.get("suffix") != pre.get("suffix"):
            div.append(item)
        if live.get("label") != pre.get("label"):
            lab.append(item)
    return n, sorted(div), sorted(lab)


def first_difference(a: str, b: str) -> tuple[int, int | None, int | None]:
    """The first position where two space-separated id lists differ, and the ids there (None: it ended)."""
    xs, ys = a.split(), b.split()
    i = next((j for j, (x, y) in enumerate(zip(xs, ys)) if x != y), min(len(xs), len(ys)))
    return i, int(xs[i]) if i < len(xs) else None, int(ys[i]) if i < len(ys) else None


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """Per precision: eligible units, the divergent set and the label-change set on each side (what left it and
    what joined it), and every trajectory that moved, with the first differing token position."""
    was, now = baseline["units"], current["units"]
    dtypes = sorted({n.rpartition("@")[2] for n in (*was, *now)})
    out: dict[str, Any] = {}
    for d in dtypes:
        n0, div0, lab0 = _sets(was, d)
        n1, div1, lab1 = _sets(now, d)
        moved = []
        compared = 0
        for name, cu in now.items():
            item, _, dd = name.rpartition("@")
            ru = was.get(name)
            if dd != d or ru is None:
                continue
            compared += 1
            if ru.get("prompt_ids_digest") != cu.get("prompt_ids_digest"):
                moved.append({"item": item, "position": None, "was": None, "now": None, "why": "prompt ids differ"})
            elif ru.get("generated") != cu.get("generated"):
                pos, a, b = first_difference(str(ru.get("generated", "")), str(cu.get("generated", "")))
                moved.append({"item": item, "position": pos, "was": a, "now": b})
        out[d] = {
            "divergence": {"was": [len(div0), n0], "now": [len(div1), n1],
                           "left": sorted(set(div0) - set(div1)), "joined": sorted(set(div1) - set(div0))},
            "labels": {"was": [len(lab0), n0], "now": [len(lab1), n1],
                       "left": sorted(set(lab0) - set(lab1)), "joined": sorted(set(lab1) - set(lab0))},
            "trajectories": {"compared": compared, "changed": len(moved), "items": moved[:KEEP]},
        }
    return out


def _rate(kn: list[int]) -> float:
    return kn[0] / kn[1] if kn[1] else 0.0


def findings(diff: Mapping[str, Any], rules: Rules) -> list[dict[str, Any]]:
    """Every movement of the diff, judged by the rules: ``kind`` is regression, improvement or change."""
    out = []
    for d, p in diff.items():
        for metric in ("divergence", "labels"):
            m = p[metric]
            same_n = m["was"][1] == m["now"][1]
            a, b = (m["was"][0], m["now"][0]) if same_n else (_rate(m["was"]), _rate(m["now"]))
            kind = rules.judge(metric, a, b, changed=bool(m["left"] or m["joined"]))
            if kind is not None:
                out.append({"metric": metric, "dtype": d, "kind": kind, "was": m["was"], "now": m["now"],
                            "left": m["left"], "joined": m["joined"]})
        t = p["trajectories"]
        kind = rules.judge("trajectories", 0, t["changed"])
        if kind is not None:
            out.append({"metric": "trajectories", "dtype": d, "kind": kind, "changed": t["changed"],
                        "compared": t["compared"]})
    return out
