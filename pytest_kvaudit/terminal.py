"""The terminal summary as pure functions returning lines (printed by the plugin's terminal summary)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .report import display_of, ordered


def _fmt_interval(iv: Iterable[float]) -> str:
    lo, hi = list(iv)
    return f"[{lo:.3f}, {hi:.3f}]"


def lines(report: Mapping[str, Any]) -> list[str]:
    """One row per claim, in display order, after the model, environment and items; then the cost."""
    out = []
    m = report["model"]
    it = report["items"]
    out.append(f"model {m.get('id')} ({m.get('architecture')}, {m.get('num_layers')} layers, {m.get('weights_digest', '')[:19]})")
    e = report.get("environment", {})
    if e:  # the switches that decide bit-exactness, so a failed replica claim comes with where to look
        onoff = {True: "on", False: "off", None: "-"}
        out.append(
            f"environment torch {e.get('torch')}, transformers {e.get('transformers')}, device {e.get('device')} "
            f"({e.get('device_name')}, {e.get('cpu_capability')}), attn {e.get('attn_implementation')}, "
            f"threads {e.get('num_threads')}, deterministic {onoff.get(e.get('deterministic_algorithms'), '-')}, "
            f"TF32 matmul {onoff.get(e.get('tf32_matmul'), '-')}, cuBLAS workspace {e.get('cublas_workspace_config') or '-'}"
        )
    inel = ", ".join(f"{k} {v}" for k, v in it.get("ineligible", {}).items()) or "none"
    out.append(f"items {it['eligible']}/{it['total']} eligible (ineligible: {inel})")
    out.append(f"{'claim':<22} {'verdict':<13} {'k/n':>9}  {'95% interval':<17} figure")
    for name in ordered(report):
        c = report["claims"][name]
        kn = f"{c['k']}/{c['n']}"
        fig = display_of(report, name).get("figure") or c["reason"]
        out.append(f"{name:<22} {c['status'].upper():<13} {kn:>9}  {_fmt_interval(c['interval']):<17} {fig}")
        if c["status"] != "pass" and fig != c["reason"]:
            out.append(f"{'':<22} └ {c['reason']}")
    cost = report.get("cost", {})
    if cost:
        ratio = cost["forward_tokens"] / cost["minimal_forward_tokens"] if cost.get("minimal_forward_tokens") else 0
        out.append(
            f"cost {cost['forward_calls']} forwards, {cost['forward_tokens']} tokens "
            f"({ratio:.2f}x the minimum), {cost['seconds']:.1f}s"
        )
    return out


def compare_lines(cmp: Mapping[str, Any]) -> list[str]:
    """What changed from the baseline, one line a change."""
    if not cmp["changes"]:
        return ["no change from the baseline: every verdict and rate within its baseline interval"]
    out = []
    for ch in cmp["changes"]:
        if ch["kind"] == "rate":
            (k0, n0), (k1, n1) = ch["was"], ch["now"]
            lo, hi = ch["baseline_interval"]
            out.append(f"REGRESSION {ch['claim']}: {ch['figure']} moved {k0}/{n0} -> {k1}/{n1}, outside the "
                       f"baseline's 95% interval [{lo:.3f}, {hi:.3f}]")
        elif ch["kind"] == "new":
            out.append(f"{ch['claim']}: new claim, {ch['now']}")
        elif ch["kind"] == "missing":
            out.append(f"{ch['claim']}: in the baseline ({ch['was']}), not judged in this run")
        else:
            tag = "REGRESSION " if ch["kind"] == "regression" else ""
            out.append(f"{tag}{ch['claim']}: {ch['was']} -> {ch['now']}")
    return out
