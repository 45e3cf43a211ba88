"""Two ledgers of the same items, token for token: which trajectories moved and which divergent sets changed.

A count can hold while the items behind it change (5/24 divergent suffixes at checkpoint N and at N+1, with
sum-004 and sum-021 replaced by sum-009 and sum-016): the gate therefore compares the sets and every item's
greedy trajectory, not only the counts, and names the item, the precision and the first token where the
trajectories part. Pure data over :mod:`pytest_kvaudit.core.cost.ledger` documents, no pytest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pytest_kvaudit.core.gate.rules import Rules

#: how many changed trajectories a diff keeps per precision (the count is always whole)
KEEP = 200
#: the ids a diff keeps around a first difference, before it and from it, to show as text beside the ids
BEFORE, FROM = 4, 8
#: the continuations compared besides the trajectory: every construction's and the 2x2's cells
BLOCKS = ("constructions", "fixed")


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


def _moved(item: str, a: str, b: str, **extra: Any) -> dict[str, Any]:
    """One changed id list: the first differing position, the ids there, and a window of ids on each side (shown
    as text by :func:`with_text`)."""
    pos, x, y = first_difference(a, b)
    xs, ys = a.split(), b.split()
    lo = max(0, pos - BEFORE)
    return {"item": item, **extra, "position": pos, "was": x, "now": y,
            "was_ids": [int(t) for t in xs[lo:pos + FROM]], "now_ids": [int(t) for t in ys[lo:pos + FROM]]}


def _continuations(item: str, ru: Mapping[str, Any], cu: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every continuation of one unit that changed token for token, construction by construction (the live
    one, prefill, the bridge, chunked ones, the 2x2's cells), where the trajectory itself did not move."""
    out = []
    for block in BLOCKS:
        was, now = ru.get(block) or {}, cu.get(block) or {}
        for name in sorted(set(was) & set(now)):
            a, b = str(was[name].get("suffix", "")), str(now[name].get("suffix", ""))
            if a != b:
                out.append(_moved(item, a, b, construction=name if block == "constructions" else f"{block}:{name}"))
    return out


def with_text(diff: dict[str, Any], decode: Callable[[str, list[int]], str] | None) -> dict[str, Any]:
    """The diff with each change's id windows decoded to text (``decode(dtype, ids)``, the run's tokenizer),
    shown beside the ids; a decoder that fails leaves the ids alone."""
    if decode is None:
        return diff
    for d, p in diff.items():
        for it in (*p["trajectories"]["items"], *p["trajectories"].get("continuations", [])):
            try:
                it["was_text"], it["now_text"] = decode(d, it.get("was_ids", [])), decode(d, it.get("now_ids", []))
            except Exception:  # noqa: BLE001 - text is for people; the ids stay the record
                return diff
    return diff


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """Per precision: eligible units, the divergent set and the label-change set on each side (what left it and
    what joined it), every trajectory that moved, with the first differing token position, and every other
    continuation that moved while its trajectory held (a prefill suffix that changes while its item stays
    divergent moves no count)."""
    was, now = baseline["units"], current["units"]
    dtypes = sorted({n.rpartition("@")[2] for n in (*was, *now)})
    out: dict[str, Any] = {}
    for d in dtypes:
        n0, div0, lab0 = _sets(was, d)
        n1, div1, lab1 = _sets(now, d)
        moved: list[dict[str, Any]] = []
        conts: list[dict[str, Any]] = []
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
                moved.append(_moved(item, str(ru.get("generated", "")), str(cu.get("generated", ""))))
            else:
                conts += _continuations(item, ru, cu)
        out[d] = {
            "divergence": {"was": [len(div0), n0], "now": [len(div1), n1],
                           "left": sorted(set(div0) - set(div1)), "joined": sorted(set(div1) - set(div0))},
            "labels": {"was": [len(lab0), n0], "now": [len(lab1), n1],
                       "left": sorted(set(lab0) - set(lab1)), "joined": sorted(set(lab1) - set(lab0))},
            "trajectories": {"compared": compared, "changed": len(moved), "items": moved[:KEEP],
                             "continuations_changed": len(conts), "continuations": conts[:KEEP]},
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
        # a continuation that moved while its trajectory held: reported, failed only when a rule says so (one
        # moving back onto the live suffix is less divergence, which the default rules call an improvement)
        kind = rules.judge("continuations", 0, t.get("continuations_changed", 0))
        if kind is not None:
            out.append({"metric": "continuations", "dtype": d, "kind": kind, "changed": t["continuations_changed"],
                        "compared": t["compared"]})
    return out
