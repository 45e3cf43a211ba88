"""The human report: claims, their sections, the analyses and figures as one self-contained HTML page.

Built from the JSON report (so it can be re-rendered from a saved one with
``python -m pytest_kvaudit.report.html report.json out.html``). Each claim brings its own section: the run hands
over the sections its claims rendered; for a saved report they are rendered by the registered claims.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvaudit.claims import base
from pytest_kvaudit.claims.htmlkit import breakable, e, status, table, words
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.report import figures as analysis
from pytest_kvaudit.report.counterexamples import counterexamples
from pytest_kvaudit.report.document import backend_of, display_of, gate_result, ordered, verdict_counts
from pytest_kvaudit.report.terminal import LEGEND, fmt_interval

#: the page's style. Every text colour meets WCAG AA (4.5:1) on the backgrounds it sits on (white, the header grey,
#: the summary's tint; tests/report/test_html_page.py measures it); tables wrap their cells (overflow-wrap) so
#: that a long layer list or text never widens the page beyond the window
CSS = """
*,*::before,*::after{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1100px;padding:0 clamp(12px,3vw,32px);
color:#222;line-height:1.4}
table{border-collapse:collapse;margin:0.6em 0 1.4em;max-width:100%}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top;overflow-wrap:break-word}
th{background:#f3f3f3}.pass{color:#176117;font-weight:bold}.fail{color:#a11;font-weight:bold}
.inconclusive{color:#7a4f00;font-weight:bold}.nowrap,.pass,.fail,.inconclusive{white-space:nowrap}
figure{display:inline-block;vertical-align:top;margin:0 1em 1em 0;max-width:min(100%,480px)}
img{max-width:100%;height:auto}
figcaption{font-size:90%;color:#555}code{background:#f6f6f6;padding:0 3px}
pre{white-space:pre-wrap;overflow-wrap:anywhere}
.summary{font-size:1.15em;background:#f4f6f8;border-left:4px solid #555;padding:0.5em 0.8em}
.texts code{white-space:pre-wrap;overflow-wrap:anywhere}
.ws{color:#555;background:#e8e8e8;border-radius:2px;padding:0 2px}
mark{background:#ffe08a;color:#222;outline:1px solid #7a4f00}
@media (max-width:1000px){table{font-size:0.8em}td,th{padding:2px 4px}}
"""


def _claim_section(report: Mapping[str, Any], name: str, given: Mapping[str, str | None]) -> str | None:
    if name in given:
        return given[name]

    if name in {c.name for c in base.registered()}:
        return base.get(name).html(report["claims"][name], report)
    return None


def summary_line(report: Mapping[str, Any]) -> str:
    """The run in one line at the top, the same words as :func:`document.summary`, its verdicts coloured."""
    parts = [f"<span class='{e(s)}'>{k} {e(s.upper())}</span>" for s, k in verdict_counts(report)]
    parts = (parts or ["no claim judged"]) + [f"backend <code>{e(backend_of(report))}</code>"]
    gate = gate_result(report)
    parts.append(f"gate <span class='{'pass' if gate == 'PASSED' else 'fail'}'>{gate}</span>" if gate
                 else "no baseline gate")
    return f"<p id='summary' class='summary'>{' · '.join(parts)}</p>"


def render(report: Mapping[str, Any], sections: Mapping[str, str | None] | None = None) -> str:
    """The page; ``sections`` maps claim name -> the HTML section that claim rendered during the run."""
    claims = report.get("claims", {})
    m, it = report.get("model", {}), report.get("items", {})
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
             f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
             f"<title>kvaudit report: {e(m.get('id'))} on {e(backend_of(report))}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>kvaudit report</h1>{summary_line(report)}<p>Model <code>{breakable(str(m.get('id')))}</code> "
             f"({e(m.get('architecture'))}, {e(m.get('num_layers'))} layers, weights "
             f"<code>{e(str(m.get('weights_digest', ''))[:23])}</code>) on <code>{e(backend_of(report))}</code>. "
             f"Items: {e(it.get('eligible'))}/{e(it.get('total'))} eligible; ineligible: "
             f"{e(words(it.get('ineligible') or {}))}.</p>"]
    if "baseline" in report:
        parts.append(gate_banner(report["baseline"]))
    rows = []
    names = ordered(report) if claims else []
    for name in names:
        c = claims[name]
        shown = display_of(report, name)
        fig = shown.get("figure") or c["reason"]
        stat = shown.get("statistic") or "Wilson 95% CI of k/n"
        why = f"<br><small>{breakable(c['reason'])}</small>" if c["status"] != "pass" and c["reason"] != fig else ""
        iv = fmt_interval(c.get("interval") if c["n"] else None, signed="Δ" in stat)
        rows.append([f"<code>{e(name)}</code>", status(c["status"], upper=True), c["n"], c["k"],
                     f"{e(stat)}: <span class='nowrap'>{e(iv)}</span>", breakable(fig) + why])
    parts.append("<h2 id='claims'>Claims</h2>" + table(
        ["claim", "verdict", "n", "k", "statistic: interval", "key figure"], rows,
        "claims") + f"<p><small>{e(LEGEND)}</small></p>")
    if "baseline" in report:
        parts.append(baseline_section(report["baseline"]))
    for name in names:
        sec = _claim_section(report, name, sections or {})
        if sec:
            parts.append(sec)
    parts.append(counterexamples(report, names))
    parts += analysis.sections(report)
    figs = analysis.figures(report)
    if figs:
        parts.append("<h2 id='figures'>Figures</h2>" + "".join(
            f"<figure id='{fid}'><img alt='{e(cap)}' src='{uri}'><figcaption>{e(cap)}</figcaption></figure>"
            for fid, cap, uri in figs))
    else:
        parts.append("<p>Figures need matplotlib: <code>pip install pytest-kvaudit[report]</code></p>")
    c = report.get("cost", {})
    if c:
        parts.append(f"<p>Cost: {c.get('forward_calls')} forwards, {c.get('forward_tokens')} tokens "
                     f"(minimum {c.get('minimal_forward_tokens')}), {c.get('seconds')} s.</p>")
    env = report.get("environment", {})
    parts.append("<h2>Environment</h2>" + table(["key", "value"], [[e(k), breakable(words(v))]
                                                                    for k, v in sorted(env.items())]))
    parts.append("</body></html>")
    return "\n".join(parts)


def gate_banner(cmp: Mapping[str, Any]) -> str:
    """The gate's result first, in a sentence: regressions fail it, and a ledger never compared is said."""
    n, m = int(cmp.get("regressions") or 0), int(cmp.get("improvements") or 0)
    verdict = (f"<span class='fail'>FAILED</span>: {n} regression{'s' * (n != 1)}" if n
               else "<span class='pass'>PASSED</span>: no regression")
    led = ("" if cmp.get("ledger") else
           " Trajectories were not compared, because the kvaudit::baseline test did not run.")
    return (f"<p id='gate'><strong>Gate against the baseline <code>{e(cmp.get('path'))}</code>: {verdict}, "
            f"{m} improvement{'s' * (m != 1)}.</strong>{led} <a href='#baseline'>Details</a>.</p>")


def baseline_section(cmp: Mapping[str, Any]) -> str:
    """The gate side by side: each claim's verdict and k/n in the baseline and in this run, then per precision
    the divergent suffixes, label changes and trajectories that moved, naming the items."""
    def side(s: Mapping[str, Any] | None) -> str:
        return "-" if s is None else f"{status(s['status'], upper=True)} {s['k']}/{s['n']}"

    kinds = {"regression": "<span class='fail'>regression</span>",
             "improvement": "<span class='pass'>improvement</span>",
             "not_compared": "not compared (a ledger's presence, not the checkpoint)", None: ""}
    rows = [[f"<code>{e(n)}</code>", side(r["was"]), side(r["now"]), kinds.get(r["kind"], e(r["kind"]))]
            for n, r in cmp.get("claims", {}).items()]
    out = [f"<h2 id='baseline'>Against the baseline</h2><p>Baseline <code>{e(cmp.get('path'))}</code> (weights "
           f"<code>{e(str(cmp.get('model_was'))[:23])}</code>), rules <code>{e(cmp.get('rules'))}</code>: "
           f"{_count(cmp.get('regressions'), 'regression')} and {_count(cmp.get('improvements'), 'improvement')}.</p>",
           table(["claim", "baseline", "this run", "change"], rows, "baseline")]
    led = cmp.get("ledger")
    if not led:
        out.append("<p>Trajectories were not compared, because the <code>kvaudit::baseline</code> test "
                   "did not run.</p>")
        return "\n".join(out)
    found = {(f["metric"], f["dtype"]): f["kind"] for f in led.get("findings", [])}
    prow = []
    for d, p in led.get("precisions", {}).items():
        for metric, what in (("divergence", "divergent suffixes"), ("labels", "label changes")):
            m = p[metric]
            prow.append([e(d), e(what), f"{m['was'][0]}/{m['was'][1]}", f"{m['now'][0]}/{m['now'][1]}",
                         e(" ".join(m["left"])), e(" ".join(m["joined"])), kinds.get(found.get((metric, d)), "change")])
        t = p["trajectories"]
        moved = "; ".join(f"{i['item']} at token {i['position']}" for i in t["items"][:20])
        prow.append([e(d), "trajectories changed", "-", f"{t['changed']}/{t['compared']}", "", e(moved),
                     kinds.get(found.get(("trajectories", d)), "")])
    out.append(table(["precision", "figure", "baseline", "this run", "left the set", "joined the set / moved",
                      "judged"], prow, "baseline-ledger"))
    return "\n".join(out)


def write(report: Mapping[str, Any], path: Path, sections: Mapping[str, str | None] | None = None) -> None:
    atomic_write_text(path, render(report, sections))


if __name__ == "__main__":
    write(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))


def _count(n: Any, word: str) -> str:
    k = int(n or 0)
    return f"{k} {word}{'s' * (k != 1)}"
