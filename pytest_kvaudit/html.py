"""The human report: the paper-style tables and figures as one self-contained HTML page.

Built from the JSON report alone (so it can be re-rendered from a saved report with
``python -m pytest_kvaudit.html report.json out.html``); figures are matplotlib PNGs inlined as data URIs.
"""

from __future__ import annotations

import base64
import html
import io
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .report import CLAIM_ORDER, atomic_write_text, key_figure
from .verdicts import ClaimResult

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:0.6em 0 1.4em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f3f3f3}.pass{color:#176117;font-weight:bold}.fail{color:#a11;font-weight:bold}
.inconclusive{color:#a66a00;font-weight:bold}figure{display:inline-block;margin:0 1em 1em 0}
figcaption{font-size:90%;color:#555}code{background:#f6f6f6;padding:0 3px}
"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{h}</tr>{body}</table>'


def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def figures(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(id, caption, data URI) for each figure; empty when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    a = report.get("analyses", {})
    an = a.get("anatomy", {})
    rows = an.get("divergent", [])
    out = []
    fig, ax = plt.subplots(figsize=(5, 3))
    by: dict[str, list[int]] = {}
    for r in rows:
        by.setdefault(r["dtype"], []).append(r["first_divergence"])
    for d, xs in sorted(by.items()):
        ax.hist(xs, bins=range(0, max(xs) + 2), alpha=0.7, label=d)
    ax.set_xlabel("suffix position of first divergence")
    ax.set_ylabel("items")
    ax.set_title(f"Where live and prefill part ({len(rows)} items)")
    if by:
        ax.legend()
    out.append(("fig-divergence-position", "Divergence position histogram: first suffix token where the live and "
                "prefill continuations differ.", _png(fig)))

    fig, ax = plt.subplots(figsize=(5, 3))
    ml = [r["margin_live"] for r in rows if r["margin_live"] is not None]
    mp = [r["margin_prefill"] for r in rows if r["margin_prefill"] is not None]
    if ml or mp:
        ax.hist([ml, mp], bins=20, label=["live", "prefill"])
        ax.legend()
    ax.set_xlabel("top-1 minus top-2 logit at the first divergence")
    ax.set_ylabel("items")
    ax.set_title("Margin at first divergence (near-ties)")
    out.append(("fig-margin", "Top-2 logit margin at the first divergence under each construction: divergence "
                "happens at near-ties.", _png(fig)))

    fig, ax = plt.subplots(figsize=(5, 3))
    for d, layers in sorted(an.get("drift", {}).items()):
        xs = [x["layer"] for x in layers]
        ax.plot(xs, [max(x["keys_rel_mean"], 1e-10) for x in layers], marker="o", label=f"{d} K")
        ax.plot(xs, [max(x["values_rel_mean"], 1e-10) for x in layers], marker="s", ls="--", label=f"{d} V")
    ax.set_yscale("log")
    ax.set_xlabel("layer")
    ax.set_ylabel("mean relative |live - prefill| (1e-10 = identical)")
    ax.set_title("Per-layer drift between boundary states")
    if an.get("drift"):
        ax.legend(fontsize=8)
    out.append(("fig-drift", "Per-layer drift: how far the live and prefill boundary K/V are apart, by depth.",
                _png(fig)))

    sw = a.get("layer_sweep", {}).get("subsets", [])
    fig, ax = plt.subplots(figsize=(5, max(2.5, 0.3 * len(sw) + 1)))
    if sw:
        import numpy as np

        m = np.array([[r["live_to_prefill"][0] / max(1, r["live_to_prefill"][1]),
                       r["prefill_to_live"][0] / max(1, r["prefill_to_live"][1])] for r in sw])
        im = ax.imshow(m, vmin=0, vmax=1, cmap="viridis", aspect="auto")
        ax.set_yticks(range(len(sw)), [r["subset"] for r in sw])
        ax.set_xticks([0, 1], ["live→prefill", "prefill→live"])
        for i in range(m.shape[0]):
            for j in range(2):
                ax.text(j, i, f"{m[i, j]:.0%}", ha="center", va="center", color="w" if m[i, j] < 0.6 else "k", fontsize=8)
        fig.colorbar(im, ax=ax, label="receivers following their donor")
    ax.set_title("Layer sweep: transplanted subset → follow rate")
    out.append(("fig-layer-sweep", "Layer-sweep heatmap: share of receivers that follow their donor when only these "
                "layers' K/V (or only K, only V) are transplanted.", _png(fig)))
    return out


def render(report: Mapping[str, Any]) -> str:
    claims = report.get("claims", {})
    m, it = report.get("model", {}), report.get("items", {})
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kvaudit report: {_e(m.get('id'))}</title>"
             f"<style>{CSS}</style></head><body>",
             f"<h1>kvaudit report</h1><p>Model <code>{_e(m.get('id'))}</code> ({_e(m.get('architecture'))}, "
             f"{_e(m.get('num_layers'))} layers, weights <code>{_e(str(m.get('weights_digest', ''))[:23])}</code>). "
             f"Items: {_e(it.get('eligible'))}/{_e(it.get('total'))} eligible; ineligible: "
             f"{_e(it.get('ineligible') or 'none')}.</p>"]
    rows = []
    for name in sorted(claims, key=lambda n: (CLAIM_ORDER.index(n) if n in CLAIM_ORDER else 99, n)):
        c = claims[name]
        cr = ClaimResult(**{**c, "interval": tuple(c["interval"])})
        fig = key_figure(cr)
        why = f"<br><small>{_e(c['reason'])}</small>" if c["status"] != "pass" and c["reason"] != fig else ""
        rows.append([f"<code>{_e(name)}</code>", f'<span class="{_e(c["status"])}">{_e(c["status"].upper())}</span>',
                     f"{c['k']}/{c['n']}", f"[{c['interval'][0]:.3f}, {c['interval'][1]:.3f}]", _e(fig) + why])
    parts.append("<h2 id='claims'>Claims</h2>" + _table(["claim", "verdict", "k/n", "95% interval", "figure"],
                                                         rows, "claims"))
    mc = claims.get("matched_construction", {}).get("figures", {})
    if mc.get("divergent_suffixes"):
        rows = [[d, f"{mc['divergent_suffixes'][d]}/{mc['n'][d]}", mc["label_disagreements"][d],
                 f"{mc['accuracy_live'][d]:.3f}", f"{mc['accuracy_prefill'][d]:.3f}", f"{mc['accuracy_diff'][d]:+.3f}",
                 f"[{mc['accuracy_diff_ci'][d][0]:+.3f}, {mc['accuracy_diff_ci'][d][1]:+.3f}]"]
                for d in mc["divergent_suffixes"]]
        parts.append("<h2 id='matched'>Matched experiment: live vs prefill of identical ids</h2>" + _table(
            ["precision", "divergent suffixes", "label disagreements", "accuracy live", "accuracy prefill", "Δ", "paired 95% CI"],
            rows, "matched"))
    fx = claims.get("fixed_prefix_2x2", {}).get("figures", {})
    if fx.get("disagreements"):
        rows = [[d, f"{fx['disagreements'][d]}/{fx['n'][d]}",
                 f"{fx.get('disagreement_upper', {}).get(d, float('nan')):.2%}" if d in fx.get("disagreement_upper", {}) else "-",
                 "/".join(map(str, fx.get("recurrence", {}).get(d, []))) or "-"] for d in fx["disagreements"]]
        parts.append(f"<h2 id='2x2'>Fixed-prefix 2x2 (prefix ids from {_e(fx.get('prefix_from'))})</h2>" + _table(
            ["precision", "replay vs prefill disagreements", "Wilson upper bound", "recurrence of matched set"], rows, "2x2"))
    for name, title in (("bridge_bitexact", "Bridge: incremental vs live"), ("ledger_audit", "Ledger audit")):
        if name in claims:
            c = claims[name]
            parts.append(f"<h2 id='{name}'>{title}</h2>" + _table(["verdict", "k/n", "reason"], [
                [f'<span class="{_e(c["status"])}">{_e(c["status"])}</span>', f"{c['k']}/{c['n']}", _e(c["reason"])]]))
    df = claims.get("donor_following", {}).get("figures", {})
    if "live_to_prefill" in df:
        rows = [[d, f"{df[d][0]}/{df[d][1]}", f"{df.get(d + '_wilson_lower', 0):.3f}"]
                for d in ("live_to_prefill", "prefill_to_live")]
        parts.append("<h2 id='transplant'>Transplant: all-layer K/V, both directions</h2>" + _table(
            ["direction", "receivers following donor", "Wilson lower bound"], rows, "transplant"))
    an = report.get("analyses", {}).get("anatomy", {})
    if an:
        rows = [[_e(r["item"]), r["dtype"], r["first_divergence"], r["suffix_len"],
                 _e(r["token_live"]) + (f" <code>{_e(r['text_live'])}</code>" if r.get("text_live") is not None else ""),
                 _e(r["token_prefill"]) + (f" <code>{_e(r['text_prefill'])}</code>" if r.get("text_prefill") is not None else ""),
                 "-" if r["margin_live"] is None else f"{r['margin_live']:.4g}",
                 "-" if r["margin_prefill"] is None else f"{r['margin_prefill']:.4g}", r["label_live"], r["label_prefill"]]
                for r in an.get("divergent", [])]
        parts.append(f"<h2 id='anatomy'>Divergence anatomy ({len(rows)} divergent items)</h2>" + _table(
            ["item", "precision", "first divergence", "suffix length", "token live", "token prefill", "margin live",
             "margin prefill", "label live", "label prefill"], rows, "anatomy"))
    sw = report.get("analyses", {}).get("layer_sweep", {})
    if sw.get("subsets"):
        rows = [[_e(r["subset"]), f"{r['live_to_prefill'][0]}/{r['live_to_prefill'][1]}",
                 f"{r['prefill_to_live'][0]}/{r['prefill_to_live'][1]}", f"{r['follow_rate']:.0%}"] for r in sw["subsets"]]
        ms = sw.get("minimal_sufficient")
        parts.append(f"<h2 id='sweep'>Layer sweep on {len(sw.get('units', []))} divergent units</h2><p>Smallest layer set "
                     f"sufficient on every unit: <code>{_e(ms['subset'] if ms else 'none')}</code></p>" + _table(
                         ["subset (layers:parts)", "live→prefill", "prefill→live", "follow rate"], rows, "sweep"))
    axes = report.get("analyses", {}).get("axes", [])
    if axes:
        rows = [[r["dtype"], _e(r.get("attn") or "default"), _e(r["construction"]), r["n"], r["state_equals_live"],
                 r["suffix_equals_live"], r["suffix_equals_prefill"]] for r in axes]
        parts.append("<h2 id='axes'>Axes: constructions and attention implementations</h2>" + _table(
            ["precision", "attention", "construction", "n", "state = live (bits)", "suffix = live", "suffix = prefill"],
            rows, "axes"))
    bi = report.get("analyses", {}).get("batch_invariance")
    if bi:
        rows = [[r["dtype"], r["batch_size"], f"{r['state_equal']}/{r['n']}"] for r in bi]
        parts.append("<h2 id='batch'>Batch invariance: alone vs inside a left-padded batch</h2>" + _table(
            ["precision", "batch size", "boundary state bit-identical to the item alone"], rows, "batch"))
    figs = figures(report)
    if figs:
        parts.append("<h2 id='figures'>Figures</h2>" + "".join(
            f"<figure id='{fid}'><img alt='{_e(cap)}' src='{uri}'><figcaption>{_e(cap)}</figcaption></figure>"
            for fid, cap, uri in figs))
    else:
        parts.append("<p>Figures need matplotlib: <code>pip install pytest-kvaudit[report]</code></p>")
    c = report.get("cost", {})
    if c:
        parts.append(f"<p>Cost: {c.get('forward_calls')} forwards, {c.get('forward_tokens')} tokens "
                     f"(minimum {c.get('minimal_forward_tokens')}), {c.get('seconds')} s.</p>")
    env = report.get("environment", {})
    parts.append("<h2>Environment</h2>" + _table(["key", "value"], [[_e(k), _e(v)] for k, v in sorted(env.items())]))
    parts.append("</body></html>")
    return "\n".join(parts)


def write(report: Mapping[str, Any], path: Path) -> None:
    atomic_write_text(path, render(report))


if __name__ == "__main__":
    write(json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]))
