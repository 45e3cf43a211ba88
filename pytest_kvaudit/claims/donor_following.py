"""All-layer bidirectional K/V transplant: every divergent continuation follows its cache donor, and the
controls (a sham transplant, a transplant of only the bit-identical layers) flip nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.claims.analyses import layer_sweep
from pytest_kvaudit.claims.base import (
    FAIL,
    INCONCLUSIVE,
    NO_INTERVAL,
    PASS,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    combine,
    names,
    register,
)
from pytest_kvaudit.claims.counterexample import detail
from pytest_kvaudit.claims.htmlkit import e, section, table
from pytest_kvaudit.claims.stats import wilson_interval

if TYPE_CHECKING:
    from pytest_kvaudit.core.model.config import AuditConfig

DIRECTIONS = ("live_to_prefill", "prefill_to_live")
#: the controls as the report names them -> the transplant kind that carries them (see cells.transplants)
CONTROLS = {"sham_flips": "sham", "identical_layer_flips": "identical"}


def donor_units(records: list[Any], max_units: int) -> list[Any]:
    """The units the claim judges: the first ``max_units`` eligible records with an all-layer transplant, in
    item order (chosen by divergence alone, never by outcome)."""
    return [r for r in records if r.eligible and r.whole_transplants()][:max_units]


@register
class DonorFollowing(Claim):
    """Every divergent receiver continues exactly as its donor did once given the donor's K/V on all layers,
    in both directions. Two in-run controls rule out a transplant path that changes outcomes by itself: the
    *sham* hands the receiver's own cache to the same transplant code as donor, and the *identical-layer*
    transplant copies only the layers whose K and V are bit-identical in the two states (where there are
    any); either must leave the receiver's suffix as it was without transplant, and one flip fails the
    claim. The figures also say which layers differ between the two states and, from the layer sweep
    (an analysis, not a pass rule), which layer subsets were sufficient on every swept unit."""

    name = "donor_following"
    needs = ("transplants", "controls")
    analyses = ("layer_sweep",)  # its figures quote the layer sweep (sufficient_subsets, swept_units)
    order = 60
    title = "Transplant: all-layer K/V, both directions"
    thresholds = {
        "min_units": Threshold(10, "least divergent units per direction", "divergent units"),
        "confidence": Threshold(0.95, "two-sided confidence of the Wilson interval (its lower bound is one-sided "
                                      "97.5%)"),
    }
    evidence = "min_units divergent units per direction, on a model whose cache is plain per-layer K/V"

    def units(self, records: list[Any], config: AuditConfig) -> list[Any]:
        return donor_units(records, config.donor_max_units)

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"divergent_units_per_direction": int(thresholds["min_units"])}

    def judge(self, ev: Evidence) -> ClaimResult:
        th = ev.thresholds
        rows = ev.eligible()
        unsupported = sorted({r.unsupported for r in rows if r.unsupported})
        figs: dict[str, Any] = {"confidence": th["confidence"],
                                "bounds": "Wilson lower, one-sided 97.5% (the end of a two-sided 95% interval)"}
        bad, statuses, reasons, details = [], [], [], []
        n_all = k_all = 0
        chosen = donor_units(rows, ev.config.donor_max_units)
        for direction in DIRECTIONS:
            ts = [(r, t) for r in chosen for t in r.whole_transplants() if t.direction == direction]
            k = sum(t.followed for _, t in ts)
            n = len(ts)
            n_all, k_all = n_all + n, k_all + k
            lo, hi = wilson_interval(k, n, th["confidence"])
            figs[direction] = [k, n]
            figs[f"{direction}_wilson_lower"] = lo if n else None
            for r, t in ts:
                if not t.followed:
                    bad.append(f"{r.item_id}@{r.dtype} {direction}")
                    details.append(detail(r, f"transplant {direction}", t, t.donor, r.constructions[t.donor]))
            statuses.append(FAIL if k < n else INCONCLUSIVE if n < th["min_units"] else PASS)
            reasons.append(f"{direction} {k}/{n}")
        control_notes = []
        for figure, kind in CONTROLS.items():
            ts = [(r, t) for r in chosen for t in r.controls(kind)]
            flips = [(r, t) for r, t in ts if not t.held]
            figs[figure] = [len(flips), len(ts)]
            for r, t in flips:
                bad.append(f"{r.item_id}@{r.dtype} {kind} {t.direction}")
                details.append(detail(r, f"{kind} {t.direction}", t, t.receiver, r.constructions[t.receiver],
                                      layers=None if t.layers is None else list(t.layers)))
            if flips:
                statuses.append(FAIL)
                control_notes.append(f"{kind} control flipped {len(flips)}/{len(ts)}")
        missing = [f"{r.item_id}@{r.dtype}" for r in chosen if not r.controls("sham")]
        if missing:  # planned with the claim's units, never computed: not a pass
            statuses.append(FAIL)
            control_notes.append(f"sham control missing on {names(missing)}")
        differing: dict[str, dict[str, int]] = {}
        whole = "per_layer" in ev.config.engine.lacks  # an engine's state read whole has no layers to name
        if whole:
            figs["per_layer"] = False
        for r in chosen if not whole else ():
            for layer in r.comparison.differing_layers:
                d = differing.setdefault(r.dtype, {})
                d[str(layer)] = d.get(str(layer), 0) + 1
        figs["differing_layers"] = {d: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for d, v in differing.items()}
        figs["identical_layer_units"] = sum(bool(r.comparison.identical_layers) for r in chosen)
        sw = layer_sweep(rows, ev.config.sweep_units)
        # tried on every swept (unit, direction) and followed on each: the bisection tries most subsets on some only
        figs["sufficient_subsets"] = sw["sufficient"]
        figs["minimal_sufficient"] = (sw["minimal_sufficient"] or {}).get("subset")
        figs["swept_units"] = len(sw["units"])
        note = ""
        if unsupported:
            statuses.append(INCONCLUSIVE)
            note = f"; {unsupported[0]}"
        elif INCONCLUSIVE in statuses and not bad:
            note = f"; needs {int(th['min_units'])} divergent units per direction"
        sham, ident = figs["sham_flips"], figs["identical_layer_flips"]
        controls = (f"; controls: sham {sham[0]}/{sham[1]} flipped, identical layers {ident[0]}/{ident[1]} flipped"
                    + (f" ({'; '.join(control_notes)})" if control_notes else ""))
        reason = (("receivers that did not follow: " + names(bad) + "; " if bad else "") + ", ".join(reasons)
                  + controls + note)
        return self.result(combine(statuses), n_all, k_all, reason, figs, bad,
                           interval=wilson_interval(k_all, n_all, th["confidence"]) if n_all else NO_INTERVAL,
                           details=details)

    def key_figure(self, result: ClaimResult) -> str:
        f = result.figures
        if "live_to_prefill" not in f:
            return result.reason
        a, b = f["live_to_prefill"], f["prefill_to_live"]
        out = f"live→prefill {a[0]}/{a[1]}, prefill→live {b[0]}/{b[1]}"
        if "sham_flips" in f:
            s, i = f["sham_flips"], f["identical_layer_flips"]
            out += f"; sham flips {s[0]}/{s[1]}, identical-layer flips {i[0]}/{i[1]}"
        layers = "; ".join(f"{d} {','.join(v)}" for d, v in (f.get("differing_layers") or {}).items() if v)
        if layers:
            out += f"; differing layers {layers}"
        return out

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        return {d: (int(figures[d][0]), int(figures[d][1])) for d in DIRECTIONS if d in figures}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        df = result.get("figures", {})
        if "live_to_prefill" not in df:
            return None

        def lower(x: Any) -> str:
            return "-" if x is None else f"{x:.3f}"

        rows = [[d, f"{df[d][0]}/{df[d][1]}", lower(df.get(d + "_wilson_lower"))] for d in DIRECTIONS]
        rows += [[f"control: {c.replace('_', ' ')}", f"{df[c][0]}/{df[c][1]} flipped", "-"] for c in CONTROLS
                 if c in df]
        layers = "; ".join(f"{d}: " + ", ".join(f"layer {k} on {v}" for k, v in ls.items())
                           for d, ls in (df.get("differing_layers") or {}).items()) or "none"
        subsets = ", ".join(df.get("sufficient_subsets") or []) or "none"
        return section("transplant", self.title, table(
            ["direction", "receivers following donor", "Wilson lower bound (one-sided 97.5%)"], rows, "transplant")
            + f"<p>Layers that differ between the live and prefill states: {e(layers)}. Layer subsets sufficient "
              f"on every swept unit: {e(subsets)}.</p>")
