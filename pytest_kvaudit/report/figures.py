"""The analyses block as HTML: divergence anatomy, layer sweep, axes and batch invariance, with figures.

Renders the report's ``analyses`` (see :mod:`pytest_kvaudit.claims.analyses`); the page builder (:mod:`.html`) places
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.htmlkit import e, png, pyplot, table, visible, words
from pytest_kvaudit.claims.layer_sweep import layers_text

#: at most this many tick labels on a layer axis (80 layers would stack theirs)
MAX_TICKS = 12


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
    _integer_ticks(ax, "both")  # positions and counts: no 2.5 items
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
    _integer_ticks(ax, "y")
    ax.set_title("Margin at first divergence (near-ties)")
    out.append(("fig-margin", "Top-2 logit margin at the first divergence under each construction: divergence "
                "happens at near-ties.", png(fig)))

    out.append(("fig-drift", "Per-layer drift: how far the live and prefill boundary K/V are apart, by depth "
                "(per layer, max |live - prefill| / max |prefill|, averaged over the items; 1e-10 stands for "
                "bit-identical).",
                _drift(plt, an.get("drift", {}))))
    sweep = a.get("layer_sweep", {})
    if sweep.get("units") and sweep.get("curves") and sweep.get("n_layers"):
        uri, strip = _sweep(plt, sweep)
        out.append(("fig-layer-sweep", "Layer sweep: share of (unit, direction) pairs whose receiver follows its "
                    "donor when the first (bottom) or last (top) j layers' K/V are transplanted. Filled markers: j "
                    "values transplanted on at least one pair; the rest of each line is inferred from monotonicity "
                    "(a pair that followed with fewer layers follows, one that did not with more does not)."
                    + (" The strip below: single layers transplanted alone, where tried (grey: not tried)."
                       if strip else ""), uri))
    return out


def _integer_ticks(ax: Any, which: str) -> None:
    from matplotlib.ticker import MaxNLocator

    for name in ("x", "y") if which == "both" else (which,):
        getattr(ax, f"{name}axis").set_major_locator(MaxNLocator(nbins=MAX_TICKS, integer=True))


def _layer_axis(ax: Any, n: int, first: int) -> None:
    """Integer layer ticks, thinned so that 30 to 80 layers do not stack their labels."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(nbins=MAX_TICKS, integer=True, min_n_ticks=min(n, 3)))
    ax.set_xlim(first - 0.5, first + n - 0.5)


def _drift(plt: Any, drift: Mapping[str, list[dict[str, Any]]]) -> str:
    n = max((len(v) for v in drift.values()), default=0)
    fig, ax = plt.subplots(figsize=(7, 3.4))
    marks = n <= 24  # markers on every layer of an 80-layer model are a smear
    for i, (d, layers) in enumerate(sorted(drift.items())):
        layers = sorted(layers, key=lambda x: int(x["layer"]))
        xs = [int(x["layer"]) for x in layers]
        ax.plot(xs, [max(x["keys_rel_mean"], 1e-10) for x in layers], color=f"C{i}", lw=1.4,
                marker="o" if marks else None, ms=4, label=f"{d} K")
        ax.plot(xs, [max(x["values_rel_mean"], 1e-10) for x in layers], color=f"C{i}", lw=1.4, ls="--",
                marker="s" if marks else None, ms=4, label=f"{d} V")
    ax.set_yscale("log")
    if n:
        _layer_axis(ax, n, 0)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_xlabel("layer")
    ax.set_ylabel("mean relative |live - prefill|")
    ax.set_title("Per-layer drift between boundary states")
    ax.grid(alpha=0.3, which="major")
    return png(fig)


def _sweep(plt: Any, sw: Mapping[str, Any]) -> tuple[str, bool]:
    """The curves (and the single-layer strip, when it shows more than the curves' j = 1): the PNG, and
    whether the strip is in it."""
    curves, singles, n = sw["curves"], sw.get("singles", []), int(sw.get("n_layers") or 0)
    if all(s_["layer"] in (0, n - 1) for s_ in singles):
        singles = []  # only the searches' j = 1 points, which the curves already show: no strip of grey
    if singles:
        fig, (ax, strip) = plt.subplots(2, 1, figsize=(7, 4.3), gridspec_kw={"height_ratios": [5, 1], "hspace": 0.55})
    else:
        fig, ax = plt.subplots(figsize=(7, 3.4))
    for i, (key, name) in enumerate((("from_bottom", "bottom j layers"), ("from_top", "top j layers"))):
        pts = [p for p in curves[key] if p["rate"] is not None]
        ax.plot([p["layers"] for p in pts], [p["rate"] for p in pts], color=f"C{i}", lw=1.6, label=name)
        tried = [p for p in pts if p["tried"]]
        ax.plot([p["layers"] for p in tried], [p["rate"] for p in tried], ls="none", marker="o", ms=5, color=f"C{i}")
    parts = {r["parts"]: r["follow_rate"] for r in sw.get("subsets", []) if r["layers"] is None and r["parts"] != "kv"}
    if parts:
        ax.text(0.99, 0.04, "all layers: " + ", ".join(f"{p.upper() if len(p) == 1 else p} only {v:.0%}"
                                                         for p, v in parts.items()),
                transform=ax.transAxes, ha="right", va="bottom", fontsize=8, color="#444")
    ax.set_ylim(-0.04, 1.04)
    ax.set_ylabel("receivers following donor")
    ax.set_title(f"Layer sweep: {len(sw.get('units', []))} units, both directions pooled ({n} layers)")
    ax.legend(fontsize=8, loc="upper left", frameon=False)  # the curves rise to the right: that corner is free
    ax.grid(alpha=0.3)
    _layer_axis(ax, n, 1)
    ax.set_xlabel("j: layers transplanted, the first j (bottom) or the last j (top)")
    if singles:
        import numpy as np

        row = np.full((1, n), np.nan)
        for s_ in singles:
            row[0, s_["layer"]] = s_["followed"] / max(1, s_["n"])
        cmap = plt.get_cmap("viridis").with_extremes(bad="#dddddd")
        strip.imshow(row, vmin=0, vmax=1, cmap=cmap, aspect="auto", extent=(-0.5, n - 0.5, 0, 1))
        if n <= 16:  # room for the numbers; beyond, the colour bar reads them
            for s_ in singles:
                v = s_["followed"] / max(1, s_["n"])
                strip.text(s_["layer"], 0.5, f"{v:.0%}", ha="center", va="center", fontsize=8,
                           color="w" if v < 0.6 else "k")
        fig.colorbar(strip.images[0], ax=strip, orientation="vertical", fraction=0.04, pad=0.01, ticks=[0, 1])
        strip.set_yticks([])
        _layer_axis(strip, n, 0)
        strip.set_xlabel("single layer transplanted alone (grey: not tried)")
    return png(fig), bool(singles)


def sections(report: Mapping[str, Any]) -> list[str]:
    """One HTML section per analysis the report holds."""
    parts: list[str] = []
    an = report.get("analyses", {}).get("anatomy", {})
    if an:
        def tok(r: Mapping[str, Any], side: str) -> str:
            text = r.get(f"text_{side}")
            return e(r[f"token_{side}"]) + ("" if text is None else f" <code>{visible(text)}</code>")

        rows = [[e(r["item"]), e(r["dtype"]), r["first_divergence"], r["suffix_len"], tok(r, "live"), tok(r, "prefill"),
                 "-" if r["margin_live"] is None else f"{r['margin_live']:.4g}",
                 "-" if r["margin_prefill"] is None else f"{r['margin_prefill']:.4g}", e(words(r["label_live"])),
                 e(words(r["label_prefill"]))]
                for r in an.get("divergent", [])]
        parts.append(f"<h2 id='anatomy'>Divergence anatomy ({len(rows)} divergent items)</h2>" + table(
            ["item", "precision", "first divergence", "suffix length", "token live", "token prefill", "margin live",
             "margin prefill", "label correct, live", "label correct, prefill"], rows, "anatomy"))
    sw = report.get("analyses", {}).get("layer_sweep", {})
    if sw.get("subsets"):
        parts.append(_sweep_section(sw))
    axes = report.get("analyses", {}).get("axes", [])
    if axes:
        rows = [[e(r["dtype"]), e(r.get("attn") or "default"), e(r.get("cache") or "dynamic"), e(r["construction"]),
                 r["n"], e(words(r["state_equals_live"])), e(words(r["suffix_equals_live"])),
                 e(words(r["suffix_equals_prefill"]))] for r in axes]
        parts.append("<h2 id='axes'>Axes: constructions, attention implementations and cache layouts</h2>" + table(
            ["precision", "attention", "cache", "construction", "n", "state = live (bits)", "suffix = live",
             "suffix = prefill"], rows, "axes"))
    bi = report.get("analyses", {}).get("batch_invariance")
    if bi:
        rows = [[r["dtype"], r["batch_size"], f"{r['state_equal']}/{r['n']}"] for r in bi]
        parts.append("<h2 id='batch'>Batch invariance: alone vs inside a left-padded batch</h2>" + table(
            ["precision", "batch size", "boundary state bit-identical to the item alone"], rows, "batch"))
    return parts


def _sweep_section(sw: Mapping[str, Any]) -> str:
    """The sweep's tried subsets (numeric order: parts, size, first layer), each pair's smallest sufficient
    bottom and top sets, and what the curves infer."""
    def subset(r: Mapping[str, Any]) -> str:
        where = layers_text(r["layers"])
        if r["layers"] is not None and len(r["layers"]) > 1:
            where = f"{where} ({len(r['layers'])} layers)"
        return f"{e(where)}: {e(r['parts'].upper() if r['parts'] in ('k', 'v') else r['parts'])}"

    rows = [[subset(r), f"{r['live_to_prefill'][0]}/{r['live_to_prefill'][1]}",
             f"{r['prefill_to_live'][0]}/{r['prefill_to_live'][1]}", f"{r['follow_rate']:.0%}"] for r in sw["subsets"]]
    ms = sw.get("minimal_sufficient")
    head = (f"<h2 id='sweep'>Layer sweep on {len(sw.get('units', []))} divergent units</h2><p>Smallest layer set "
            f"transplanted on every unit and direction and followed on each: "
            f"<code>{e(layers_text(ms['layers']) if ms else 'none')}</code>")
    if "sufficient_bottom" in sw:
        def j(x: Any) -> str:
            return "none" if x is None else str(x)

        head += (f". Bottom layers every pair follows with: {j(sw['sufficient_bottom'])}; top layers: "
                 f"{j(sw['sufficient_top'])} (of {sw.get('n_layers')}; the pair that needs the most, observed, the "
                 "others by monotonicity)")
    listed = table(["layers: parts", "live→prefill", "prefill→live", "follow rate"], rows, "sweep")
    if len(rows) > 20:  # a 30-80 layer model's searches try dozens of sets, each on some pairs: folded, not gone
        listed = f"<details><summary>All {len(rows)} transplanted subsets</summary>{listed}</details>"
    out = head + ".</p>" + listed
    mins = sw.get("minimal", [])
    if mins:
        out += ("<p>Per unit and direction, the smallest bottom j and top j whose K/V make the receiver follow "
                "(a binary search: j follows and j - 1 does not, both transplanted; none: not even all layers).</p>"
                + table(["unit", "direction", "bottom j", "top j", "subsets tried"],
                        [[e(m["unit"]), e(m["direction"].replace("_", " ")), "none" if m["bottom"] is None
                          else m["bottom"], "none" if m["top"] is None else m["top"], m["tried"]] for m in mins],
                        "sweep-minimal"))
    note = sw.get("curves", {}).get("note")
    return out + (f"<p><small>{e(note)}</small></p>" if note else "")
