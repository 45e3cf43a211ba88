"""Which layers carry the divergence: transplant single layers, the first or last j, K only, V only."""

from __future__ import annotations

from ..analyses import layer_sweep as sweep
from .base import FAIL, INCONCLUSIVE, PASS, Claim, ClaimResult, Evidence, Threshold, register


@register
class LayerSweep(Claim):
    name = "layer_sweep"
    order = 70
    title = "Layer sweep"
    thresholds = {"min_units": Threshold(1, "least swept divergent units", "divergent units")}
    evidence = "min_units divergent units that carry the layer sweep's transplants"

    def judge(self, ev: Evidence) -> ClaimResult:
        sw = sweep(ev.records, ev.config.sweep_units)
        rows = {r["subset"]: r for r in sw["subsets"]}
        n = len(sw["units"])
        allkv = rows.get("all:kv")
        k = 0 if allkv is None else min(allkv["live_to_prefill"][0], allkv["prefill_to_live"][0])
        minimal = sw["minimal_sufficient"]
        figs = {"subsets": {r["subset"]: {"live_to_prefill": r["live_to_prefill"], "prefill_to_live": r["prefill_to_live"],
                                          "follow_rate": r["follow_rate"]} for r in sw["subsets"]},
                "minimal_sufficient": minimal["subset"] if minimal else None, "units": sw["units"]}
        if n < ev.thresholds["min_units"] or allkv is None:
            return self.result(INCONCLUSIVE, n, k, f"{n} swept divergent units, needs {int(ev.thresholds['min_units'])}",
                               figs)
        if k < n:
            return self.result(FAIL, n, k, f"all-layer transplant not followed on {n - k}/{n} swept units", figs)
        partial = sorted((r for r in sw["subsets"] if r["subset"] != "all:kv"), key=lambda r: -r["follow_rate"])
        best = ", ".join(f"{r['subset']} {r['follow_rate']:.0%}" for r in partial[:3])
        return self.result(PASS, n, k, f"all layers sufficient on {k}/{n}; smallest sufficient subset "
                                       f"{minimal['subset'] if minimal else '-'}; best partial: {best}", figs)
