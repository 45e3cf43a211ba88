"""The terminal summary as pure functions returning lines (printed by the plugin's terminal summary)."""

from __future__ import annotations

import math
import os
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_kvaudit.core.model.engines import find
from pytest_kvaudit.core.planning.strict_gate import gate_lines
from pytest_kvaudit.report.document import display_of, ordered

#: the claims table's width in columns: it fits a 120-column terminal
WIDTH = 120
#: how many counterexamples the table shows under a claim (the JSON and HTML carry all of them)
SHOWN_DETAILS = 3
LEGEND = ("n: units judged; k: units where the claim's property holds; interval: the statistic named, "
          "'-' where there is none (0/0)")


def fmt_interval(iv: Iterable[float | None] | None, signed: bool = False) -> str:
    """``[lo, hi]`` to three places; a dash for a statistic over nothing (null or non-finite bounds)."""
    lo, hi = list(iv) if iv is not None else (None, None)
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return "-"
    f = "+.3f" if signed else ".3f"
    return f"[{lo:{f}}, {hi:{f}}]"


def _snippet(text: str, at: int, width: int = 28) -> str:
    part = text[max(0, at - 8): at + width]
    return ("…" if at > 8 else "") + part + ("…" if len(text) > at + width else "")


def detail_line(d: Mapping[str, Any]) -> str:
    """One counterexample: unit, the first differing suffix position, the top-2 margins there, both texts
    from just before where they part."""
    ta, tb = str(d.get("text_a") or ""), str(d.get("text_b") or "")
    at = len(os.path.commonprefix([ta, tb]))

    def m(x: Any) -> str:
        return "-" if x is None else f"{x:.4g}"

    pos = "equal suffixes" if d.get("position") is None else f"pos {d['position']}"
    extra = f" ({d['differs']})" if d.get("differs") else ""
    return (f"{d.get('unit')} {pos}{extra}, margin {m(d.get('margin_a'))}/{m(d.get('margin_b'))}: "
            f"{d.get('a')} {_snippet(ta, at)!r} vs {d.get('b')} {_snippet(tb, at)!r}")


def lines(report: Mapping[str, Any]) -> list[str]:
    """One row per claim, in display order, after the model, environment and items; then the cost."""
    out = []
    m = report["model"]
    it = report["items"]
    out.append(f"model {m.get('id')} ({m.get('architecture')}, {m.get('num_layers')} layers, "
               f"{m.get('weights_digest', '')[:19]})")
    e = report.get("environment", {})
    if e:  # the switches that decide bit-exactness, so a failed replica claim comes with where to look
        onoff = {True: "on", False: "off", None: "-"}
        out.append(
            f"environment torch {e.get('torch')}, transformers {e.get('transformers')}, device {e.get('device')} "
            f"({e.get('device_name')}, {e.get('cpu_capability')}), attn {e.get('attn_implementation')}, "
            f"threads {e.get('num_threads')}, deterministic {onoff.get(e.get('deterministic_algorithms'), '-')}, "
            f"TF32 matmul {onoff.get(e.get('tf32_matmul'), '-')}, cuBLAS workspace "
            f"{e.get('cublas_workspace_config') or '-'}"
        )
        spec = find(e.get("backend"))  # the engine that ran the model says what it adds (its own record's lines)
        if spec is not None and spec.report_lines is not None:
            out += spec.report_lines(e)
    inel = ", ".join(f"{k} {v}" for k, v in it.get("ineligible", {}).items()) or "none"
    stop = (f"; suffixes end at the first match of {it['stop_regex']!r} (--kvaudit-stop-regex=off: the whole budget)"
            if it.get("stop_regex") else "")
    out.append(f"items {it['eligible']}/{it['total']} eligible (ineligible: {inel}){_template_hint(it)}{stop}")
    out += claims_table(report)
    out += textwrap.wrap(LEGEND, WIDTH)
    cost = report.get("cost", {})
    if cost:
        ratio = cost["forward_tokens"] / cost["minimal_forward_tokens"] if cost.get("minimal_forward_tokens") else 0
        out.append(
            f"cost {cost['forward_calls']} forwards, {cost['forward_tokens']} tokens "
            f"({ratio:.2f}x the {cost['minimal_forward_tokens']} the claims need), {cost['seconds']:.1f}s"
        )
    plan = report.get("plan") or {}
    if cost and plan.get("forward_tokens"):
        out.append(plan_vs_actual(plan, cost))
    return out


def claims_table(report: Mapping[str, Any]) -> list[str]:
    """The claims, one row each within :data:`WIDTH` columns: name, verdict, n, k, interval and the statistic named
    (wrapped in its column); beneath, on the ``└`` lines, the key figure and, where the claim did not pass, its
    reason; then up to :data:`SHOWN_DETAILS` counterexamples (``·``). Long lines wrap under their marker."""
    out = [f"{'claim':<22} {'verdict':<13} {'n':>5} {'k':>5}  {'interval':<17} statistic"]
    for name in ordered(report):
        c = report["claims"][name]
        shown = display_of(report, name)
        fig = shown.get("figure") or c["reason"]
        stat = shown.get("statistic") or "Wilson 95% CI of k/n"
        iv = fmt_interval(c.get("interval") if c.get("n") else None, signed="Δ" in stat)
        row = f"{name:<22} {c['status'].upper():<13} {c['n']:>5} {c['k']:>5}  {iv:<17} "
        out += _hanging(row, stat, len(row))
        out += _hanging(f"{'':<22} └ ", fig)
        if c["status"] != "pass" and fig != c["reason"]:
            out += _hanging(f"{'':<22} └ ", c["reason"])
        details = c.get("details") or []
        for d in details[:SHOWN_DETAILS]:
            out += _hanging(f"{'':<22} · ", detail_line(d))
        if len(details) > SHOWN_DETAILS:
            out.append(f"{'':<22} · and {len(details) - SHOWN_DETAILS} more in the JSON report")
    return out


def _hanging(lead: str, text: str, indent: int | None = None) -> list[str]:
    """``lead`` then ``text``, wrapped to :data:`WIDTH` with later lines under the text's start (a word longer
    than the room, such as a path, is broken)."""
    pad = " " * (len(lead) if indent is None else indent)
    return textwrap.wrap(text, WIDTH, initial_indent=lead, subsequent_indent=pad, drop_whitespace=True) or [lead]


def _template_hint(items: Mapping[str, Any]) -> str:
    """Items short of their boundary while the checkpoint's chat template was left off: name the likely cause."""
    chat = items.get("chat_template") or {}
    if not items.get("ineligible", {}).get("boundary_not_reached") or chat.get("applied") or not chat.get("source"):
        return ""
    return (f"; the chat template ({chat['source']}) was off: an instruct model fed bare prompts rarely reaches "
            "the boundary, so --kvaudit-chat-template=auto or on is the likely fix")


def plan_vs_actual(plan: Mapping[str, Any], cost: Mapping[str, Any]) -> str:
    """The run's end: what the plan said against what the run took."""
    ran = cost["forward_tokens"]
    line = f"plan vs actual: ran {ran} forward tokens"
    pred = plan.get("forward_tokens_predicted")
    if pred is not None:
        led = plan.get("ledger") or {}
        src = f"the ledger {_near(str(led['path']))}" if led.get("usable") else "the calibration sample"
        if led.get("usable") and not led.get("exact"):  # another CPU or library computed those lengths
            src += (", recorded where " + ", ".join(d.split(" recorded")[0] for d in led.get("environment_differences")
                                                      or ["axes"]) + " differed, so an estimate")
        line += f", predicted {pred} from {src} ({'exact' if pred == ran else f'{ran / max(1, pred):.3f}x'})"
    priced = (plan.get("priced_after_run") or {}).get("forward_tokens")
    line += f"; at most {plan['forward_tokens']} (the plan's bound)"
    if priced is not None:
        line += f", {priced} priced from the lengths the run produced"
    est = plan.get("estimate") or {}  # a --kvaudit-plan run's estimate of this same run, from pytest's cache
    if est.get("seconds_expected"):
        line += (f"; --kvaudit-plan estimated {est['seconds_expected']:.0f}s with {est.get('workers', 1)} worker(s), "
                 f"the computation took {cost['seconds']:.0f}s ({cost['seconds'] / est['seconds_expected']:.2f}x)")
    return line


def _near(path: str) -> str:
    """A path relative to the current folder when it lies under it (shorter lines), else as given."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def plan_lines(plan: Mapping[str, Any]) -> list[str]:
    """The plan (``--kvaudit-plan``): cells and forwards per precision and step, memory, time, and what each
    claim can decide with these items."""
    m = plan["model"]
    out = [f"{plan['items']} items ({plan['items_too_long']} too long) x {', '.join(plan['precisions'])}, "
           f"max_new_tokens {plan['max_new_tokens']}, {plan['workers']} worker(s); model {m['layers']} layers, "
           f"{m['kv_heads']} KV heads x {m['head_dim']}, {m['parameters']:,} parameters"]
    col = "forward_tokens_predicted" if plan.get("forward_tokens_predicted") is not None else "forward_tokens_expected"
    out.append(f"{'precision':<10} {'step':<22} {'cells':>7} {'calls (bound)':>14} {'tokens (bound)':>15} "
               f"{'tokens (predicted)':>18}")
    for d, steps in plan["steps"].items():
        for k, a in steps.items():
            out.append(f"{d:<10} {k:<22} {a['cells']:>7} {a['forward_calls']:>14} {a['forward_tokens']:>15} "
                       f"{a.get(col) or 0:>18}")
    out.append(f"forward tokens: at most {plan['forward_tokens']:,} in {plan['forward_calls']:,} calls "
               f"({plan['bound']})")
    if plan.get("forward_tokens_predicted") is not None:
        out.append(f"forward tokens predicted: {plan['forward_tokens_predicted']:,} in "
                   f"{plan['forward_calls_predicted']:,} calls, from {plan['predicted_basis']}")
    led = plan.get("ledger") or {}
    if not led.get("usable") and led.get("why"):
        out.append(f"  (no exact prediction: {led['why']}; a recorded ledger of this model makes one)")
    mem = plan["memory"]
    out.append("peak K/V cache: " + ", ".join(f"{d} {_bytes(b)}" for d, b in mem["peak_cache_bytes"].items())
               + f" ({mem['basis']}); weights " + ", ".join(f"{d} {_bytes(b)}"
                                                            for d, b in mem["weights_bytes"].items()))
    cal = plan["calibration"]
    per = ", ".join(f"{d} {cal[d]['per_call_s'] * 1e3:.2f} ms/call + {cal[d]['per_token_s'] * 1e6:.1f} us/token, "
                    f"load {cal[d]['load_s']:.1f}s" for d in plan["precisions"] if d in cal)
    out.append(f"time on this device: expected {plan['seconds_expected']:.0f}s, at most {plan['seconds_bound']:.0f}s "
               f"({per}; calibration took {cal['seconds']:.1f}s)")
    if plan.get("work") is not None:
        out.append(f"computes only what the selected claims read: {', '.join(plan['work'])}")
    for name, c in plan["claims"].items():
        needs = "; ".join(f"{w} needs {r['needs']}, at most {r['at_most']}, expected "
                          f"{'-' if r['expected'] is None else round(r['expected'], 1)}" for w, r in c["needs"].items())
        why = f" ({c['why']})" if c.get("why") else ""
        out.append(f"{name:<22} decides: {c['decides']:<19} {needs or 'no least evidence declared'}{why}")
        out += strict_lines(c, plan["items"], (plan.get("strict_gate") or {}).get("basis", "the calibration"))
    return out + gate_lines(plan.get("strict_gate") or {})


def strict_lines(c: Mapping[str, Any], items: int, basis: str = "the calibration") -> list[str]:
    """What n a strict gate (--kvaudit-strict) needs for a claim to decide, and a warning when the run has less."""
    st = c.get("strict") or {}
    if c.get("decides") in ("not applicable", "not declared") or not st.get("by"):
        return []
    need = {w: r.get("needs") for w, r in (c.get("needs") or {}).items()}
    by = ", ".join(f"{w}{f' {need[w]}' if w in need else ''} -> {'never' if v is None else v}"
                   for w, v in st["by"].items())
    chance = f"an {st.get('chance', 0.8):.0%} chance to pass under --kvaudit-strict"
    lo, hi = (st.get("range") or [None, None])[:2]
    span = ("" if lo is None or (lo == hi == st.get("n")) else
            f"; {lo} to {'no n' if hi is None else hi} items over the calibrated rates' 95% intervals")
    if st.get("n") is None and st.get("at_least") is not None:
        return [f"{'':<22} strict n: unknown, at least {st['at_least']} items ({by}): {basis} saw nothing to "
                f"estimate a rate from (the needs marked never), so {chance} needs a larger calibration or a run."]
    if st.get("n") is None:
        return [f"{'':<22} strict n: no n reaches it at these rates ({by}), so --kvaudit-strict fails it."]
    warn = f"; WARNING: this run has n={items}, so --kvaudit-strict is likely to fail it" if items < st["n"] else ""
    return [f"{'':<22} strict n: {st['n']} items ({by}) for {chance}{span}{warn}."]
