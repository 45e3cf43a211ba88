"""The analyses block as HTML: divergence anatomy, layer sweep, axes and batch invariance, with figures.

Renders the report's ``analyses`` (see :mod:`.analyses`); the page builder (:mod:`.html`) places them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.htmlkit import e, png, pyplot, table


def figures(report: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(id, caption, data URI) for each figure; empty when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
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
                "prefill continuations differ.", png(fig)))

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
                "happens at near-ties.", png(fig)))

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
                png(fig)))

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
                "layers' K/V (or only K, only V) are transplanted.", png(fig)))
    return out


def sections(report: Mapping[str, Any]) -> list[str]:
    """One HTML section per analysis the report holds."""
    parts: list[str] = []
    an = report.get("analyses", {}).get("anatomy", {})
    if an:
        rows = [[e(r["item"]), r["dtype"], r["first_divergence"], r["suffix_len"],
                 e(r["token_live"]) + (f" <code>{e(r['text_live'])}</code>" if r.get("text_live") is not None else ""),
                 e(r["token_prefill"]) + (f" <code>{e(r['text_prefill'])}</code>" if r.get("text_prefill") is not None else ""),
                 "-" if r["margin_live"] is None else f"{r['margin_live']:.4g}",
                 "-" if r["margin_prefill"] is None else f"{r['margin_prefill']:.4g}", r["label_live"], r["label_prefill"]]
                for r in an.get("divergent", [])]
        parts.append(f"<h2 id='anatomy'>Divergence anatomy ({len(rows)} divergent items)</h2>" + table(
            ["item", "precision", "first divergence", "suffix length", "token live", "token prefill", "margin live",
             "margin prefill", "label live", "label prefill"], rows, "anatomy"))
    sw = report.get("analyses", {}).get("layer_sweep", {})
    if sw.get("subsets"):
        rows = [[e(r["subset"]), f"{r['live_to_prefill'][0]}/{r['live_to_prefill'][1]}",
                 f"{r['prefill_to_live'][0]}/{r['prefill_to_live'][1]}", f"{r['follow_rate']:.0%}"] for r in sw["subsets"]]
        ms = sw.get("minimal_sufficient")
        parts.append(f"<h2 id='sweep'>Layer sweep on {len(sw.get('units', []))} divergent units</h2><p>Smallest layer set "
                     f"sufficient on every unit: <code>{e(ms['subset'] if ms else 'none')}</code></p>" + table(
                         ["subset (layers:parts)", "live→prefill", "prefill→live", "follow rate"], rows, "sweep"))
    axes = report.get("analyses", {}).get("axes", [])
    if axes:
        rows = [[r["dtype"], e(r.get("attn") or "default"), e(r.get("cache") or "dynamic"), e(r["construction"]), r["n"],
                 r["state_equals_live"], r["suffix_equals_live"], "-" if r["suffix_equals_prefill"] is None
                 else r["suffix_equals_prefill"]] for r in axes]
        parts.append("<h2 id='axes'>Axes: constructions, attention implementations and cache layouts</h2>" + table(
            ["precision", "attention", "cache", "construction", "n", "state = live (bits)", "suffix = live",
             "suffix = prefill"], rows, "axes"))
    bi = report.get("analyses", {}).get("batch_invariance")
    if bi:
        rows = [[r["dtype"], r["batch_size"], f"{r['state_equal']}/{r['n']}"] for r in bi]
        parts.append("<h2 id='batch'>Batch invariance: alone vs inside a left-padded batch</h2>" + table(
            ["precision", "batch size", "boundary state bit-identical to the item alone"], rows, "batch"))
    return parts
