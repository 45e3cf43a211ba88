"""Beyond the paper: where the divergence lives, which layers carry it, and the construction axes.

The layer sweep is an analysis, not a claim: which layer subsets carry the divergence is descriptive
(the paper claims sufficiency of all layers, which donor_following judges; its figures quote the sweep).

Pure functions over store records; their output is the report's ``analyses`` block.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pytest_kvaudit.claims.layer_sweep import layer_sweep


def first_divergence(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def anatomy(records: Iterable[Any]) -> dict[str, Any]:
    """Per divergent item: where live and prefill part, the top-2 margins there, and per-layer drift."""
    rows: list[dict[str, Any]] = []
    drift_acc: dict[str, dict[int, list[float]]] = {}
    for r in records:
        if not r.eligible:
            continue
        live, pre = r.constructions["live"], r.constructions["prefill"]
        if r.drift:
            acc = drift_acc.setdefault(r.dtype, {})
            for layer, kmax, vmax, krel, vrel in r.drift:
                a = acc.setdefault(int(layer), [0, 0.0, 0.0, 0.0, 0.0])
                a[0] += 1
                a[1] = max(a[1], kmax)
                a[2] = max(a[2], vmax)
                a[3] += krel
                a[4] += vrel
        j = first_divergence(live.suffix, pre.suffix)
        if j is None:
            continue
        rows.append({
            "item": r.item_id, "dtype": r.dtype, "first_divergence": j, "suffix_len": len(live.suffix),
            "token_live": live.suffix[j] if j < len(live.suffix) else None,
            "token_prefill": pre.suffix[j] if j < len(pre.suffix) else None,
            "margin_live": live.margins[j] if j < len(live.margins) else None,
            "margin_prefill": pre.margins[j] if j < len(pre.margins) else None,
            "label_live": live.label, "label_prefill": pre.label,
            "text_live": r.comparison.divergence_text[0] if r.comparison.divergence_text else None,
            "text_prefill": r.comparison.divergence_text[1] if r.comparison.divergence_text else None,
        })
    drift = {
        d: [{"layer": layer, "keys_max_abs": a[1], "values_max_abs": a[2], "keys_rel_mean": a[3] / a[0],
             "values_rel_mean": a[4] / a[0]} for layer, a in sorted(acc.items())]
        for d, acc in drift_acc.items()
    }
    return {"divergent": rows, "drift": drift}


def first_differences(records: Iterable[Any]) -> dict[str, Any]:
    """Per precision, where two boundary states that an engine reads per position (vLLM's blocks) first part:
    warm (blocks written by decode) vs cold (written by one prefill): units compared, units that differ, the
    first differing layer's count over units, and each unit's layer, part, position and ULPs there."""
    out: dict[str, Any] = {}
    for r in records:
        fd = getattr(r.comparison, "first_difference", None)
        if not r.eligible or not fd or "warm_vs_cold" not in fd:
            continue
        d = out.setdefault(r.dtype, {"units": 0, "differ": 0, "first_layer": {}, "rows": []})
        d["units"] += 1
        if (w := fd["warm_vs_cold"]) is not None:
            d["differ"] += 1
            d["first_layer"][str(w["layer"])] = d["first_layer"].get(str(w["layer"]), 0) + 1
            d["rows"].append({"item": r.item_id, **w})
    return out


def construction_axes(records: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per (precision, construction): how often its boundary state is bit-identical to the live
    cache, and how often its suffix equals live's and prefill's."""
    acc: dict[tuple[str, str], list[int]] = {}
    reuse: dict[tuple[str, str], list[int]] = {}  # an engine's warm construction: tokens reused, units that reused none
    for r in records:
        if not r.eligible:
            continue
        live, pre = r.constructions["live"], r.constructions["prefill"]
        for name, c in r.constructions.items():
            if name.endswith(":replica") or name == "live":
                continue
            if getattr(c, "reused", None) is not None:
                u = reuse.setdefault((r.dtype, name), [0, 0])
                u[0] += c.reused
                u[1] += c.reused == 0
                if c.reused == 0:  # reused nothing: a cold prefill, not a warm unit
                    continue
            a = acc.setdefault((r.dtype, name), [0, 0, 0, 0])
            a[0] += 1
            a[1] += c.state_fp == live.state_fp
            a[2] += c.suffix == live.suffix
            a[3] += c.suffix == pre.suffix
    rows = [{"dtype": d, "construction": c, "attn": None, "cache": "dynamic", "n": a[0], "state_equals_live": a[1],
             "suffix_equals_live": a[2], "suffix_equals_prefill": a[3],
             **({"reused_tokens": reuse[d, c][0], "warm_cold": reuse[d, c][1]} if (d, c) in reuse else {})}
            for (d, c), a in sorted(acc.items())]
    att: dict[tuple[str, str], list[int]] = {}
    for r in records:
        for name, o in r.probes.axes.items():
            if o.get("eligible"):
                a = att.setdefault((r.dtype, name), [0, 0, 0])
                a[0] += 1
                a[1] += o["state_equal"]
                a[2] += o["suffix_equal"]
    rows += [{"dtype": d, "construction": "prefill", "attn": name, "cache": "dynamic", "n": a[0],
              "state_equals_live": a[1], "suffix_equals_live": a[2], "suffix_equals_prefill": a[0]}
             for (d, name), a in sorted(att.items())]
    return rows + cache_axes(records)


def cache_axes(records: Iterable[Any]) -> list[dict[str, Any]]:
    """Rows for the other cache layouts (``--kvaudit-cache=dynamic,static``), on each layout's own trajectory:
    its prefill (replay) and incremental replay (the bridge) against its live state, a live-to-prefill
    transplant into the layout's tensors, and its live state against the dynamic layout's."""
    acc: dict[tuple[str, str, str], list[int]] = {}
    for r in records:
        for kind, o in r.probes.cache.items():
            if not o.get("eligible") or o.get("lossy"):  # a lossy kind is judged against a budget, not for exactness
                continue
            pre = o["prefill"]["suffix"]
            for name in ("prefill", "incremental"):
                c = o[name]
                a = acc.setdefault((r.dtype, kind, name), [0, 0, 0, 0])
                a[0] += 1
                a[1] += c["state_equal"]
                a[2] += c["suffix_equal"]
                a[3] += c["suffix"] == pre
            t = o["transplant"]
            a = acc.setdefault((r.dtype, kind, "transplant:live_to_prefill"), [0, 0, 0, 0])
            a[0] += 1
            a[1] += t["state_equal"]
            a[2] += t["followed"]
            a[3] += t["held"]
            a = acc.setdefault((r.dtype, kind, "live"), [0, 0, 0, 0])
            a[0] += 1
            a[1] += o["state_equals_dynamic"]
            a[2] += o["suffix_equals_dynamic"]
    order = {"live": 0, "prefill": 1, "incremental": 2, "transplant:live_to_prefill": 3}
    rows = []
    for (d, kind, name), a in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1], order[kv[0][2]])):
        row: dict[str, Any] = {"dtype": d, "construction": name, "attn": None, "cache": kind, "n": a[0],
                               "state_equals_live": a[1], "suffix_equals_live": a[2], "suffix_equals_prefill": a[3]}
        if name == "live":  # this layout's live state against the dynamic layout's live state
            row.update(state_equals_live=a[0], suffix_equals_live=a[0], suffix_equals_prefill=None,
                       state_equals_dynamic=a[1], suffix_equals_dynamic=a[2])
        rows.append(row)
    return rows


def batch_invariance(records: Iterable[Any]) -> list[dict[str, Any]]:
    acc: dict[tuple[str, int], list[int]] = {}
    for r in records:
        if r.probes.batch and "state_equal" in r.probes.batch:
            a = acc.setdefault((r.dtype, r.probes.batch["batch_size"]), [0, 0])
            a[0] += 1
            a[1] += r.probes.batch["state_equal"]
    return [{"dtype": d, "batch_size": b, "n": a[0], "state_equal": a[1], "suffix_equal": None}
            for (d, b), a in sorted(acc.items())]


def build(records: list[Any], sweep_units: int) -> dict[str, Any]:
    fd = first_differences(records)  # only where an engine reads its states per position (vLLM)
    return {"anatomy": anatomy(records), "layer_sweep": layer_sweep(records, sweep_units),
            "axes": construction_axes(records), "batch_invariance": batch_invariance(records),
            **({"first_difference": fd} if fd else {})}
