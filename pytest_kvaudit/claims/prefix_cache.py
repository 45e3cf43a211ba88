"""Does my prefix cache change outputs? One verdict on an engine's prefix cache, over its three hit shapes.

- **whole-block** (the boundary on a block edge, all of ``prefix[:-1]`` reused): must continue bit for bit as
  the request that wrote the blocks (blocks, suffix, logits); one counterexample fails the claim;
- **partial** (the item's own boundary: whole blocks reused, the tail prefilled, the multi-turn case) and
  **cross-request** (blocks another request wrote): reported, not failed, as suffix, answer and label changes
  against live and against cold with Wilson intervals, and where the states first differ (layer, position).

A unit counts as a hit only with the engine's proof (``num_cached_tokens > 0``); the others are counted apart.
The cells come from :mod:`pytest_kvaudit.core.requests.hits`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims.base import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    Claim,
    ClaimResult,
    Evidence,
    Threshold,
    names,
    register,
)
from pytest_kvaudit.claims.htmlkit import e, section, status, table
from pytest_kvaudit.claims.stats import wilson_interval
from pytest_kvaudit.core.model.config import AuditConfig

WHOLE, PARTIAL, CROSS = "warm:block", "warm", "cross"


def _rate(k: int, n: int, conf: float) -> list[float] | None:
    return list(wilson_interval(k, n, conf)) if n else None


def changes(rows: list[Any], name: str, conf: float) -> dict[str, Any]:
    """How the hits of construction ``name`` (proven by ``reused > 0``) part from live and from cold."""
    hit = [r for r in rows if name in r.constructions and (r.constructions[name].reused or 0) > 0]
    out: dict[str, Any] = {"n": len(hit), "no_hit": sum(1 for r in rows if r.constructions.get(name) is not None
                                                          and not r.constructions[name].reused)}
    for ref in ("live", "prefill"):
        side = "cold" if ref == "prefill" else ref
        for what, differs in (("suffix", lambda a, b: a.suffix != b.suffix),
                              ("answer", lambda a, b: a.answer != b.answer),
                              ("label", lambda a, b: a.label != b.label)):
            k = sum(differs(r.constructions[name], r.constructions[ref]) for r in hit)
            out[f"{what}_changes_vs_{side}"] = [k, len(hit)]
            out[f"{what}_changes_vs_{side}_ci"] = _rate(k, len(hit), conf)
    first: dict[str, int] = {}
    rows_fd = []
    for r in hit:
        fd = r.comparison.first_difference.get(f"{name}_vs_live" if name == PARTIAL else f"{name}_vs_cold")
        if fd:
            first[str(fd["layer"])] = first.get(str(fd["layer"]), 0) + 1
            rows_fd.append({"item": r.item_id, **fd})
    out["first_difference"] = {"against": "live" if name == PARTIAL else "cold", "first_layer": first, "rows": rows_fd}
    out["cached_tokens"] = sum(r.constructions[name].reused for r in hit)
    return out


def whole_blocks(rows: list[Any]) -> tuple[dict[str, bool], dict[str, str], int]:
    """Each whole-block hit's verdict (bit for bit, blocks + suffix + logits), why a bad one is bad, and the
    units that had no whole-block hit (no block edge inside the working, or the engine hit nothing)."""
    ok, why, none = {}, {}, 0
    for r in rows:
        w = r.requests.get(WHOLE)
        if not w or not w.get("num_cached_tokens"):
            none += w is not None
            continue
        unit = f"{r.item_id}@{r.dtype}"
        bad = [p for p in ("blocks", "suffix", "logits") if not w.get(f"{p}_equal")]
        ok[unit] = not bad
        if bad:
            fd = w.get("first_difference") or {}
            why[unit] = ", ".join(bad) + (f" (layer {fd['layer']}, position {fd['position']})" if fd else "")
    return ok, why, none


@register
class PrefixCache(Claim):
    name = "prefix_cache"
    order = 45
    title = "Prefix cache: hits vs the requests that wrote them"
    needs = ("trajectory", "prefill", "warm")
    thresholds = {"min_units": Threshold(12, "least whole-block hits (units with cached tokens)", "items x precisions"),
                  "confidence": Threshold(0.95, "the Wilson intervals' level")}
    evidence = "min_units whole-block hits proven by the engine's cached tokens"

    def applicable(self, config: AuditConfig) -> str | None:
        if "warm" not in config.engine.constructions:
            return (f"the {config.engine.name} backend has no prefix cache (vLLM's is audited with "
                    "--kvaudit-backend=vllm)")
        return super().applicable(config)

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        return {"items_x_precisions": int(thresholds["min_units"])}

    def judge(self, ev: Evidence) -> ClaimResult:
        conf = ev.thresholds["confidence"]
        rows = ev.eligible()
        if rows and not any(WHOLE in r.requests for r in rows):
            return self.result(INCONCLUSIVE, 0, 0, f"the {ev.config.engine.name} backend's prompt cache has no "
                               "blocks: its warm construction is in the construction axes; the three block shapes "
                               "are vLLM's")
        figs: dict[str, Any] = {"confidence": conf, "per_dtype": {}}
        ok: dict[str, bool] = {}
        why: dict[str, str] = {}
        for d in ev.dtypes:
            mine = [r for r in rows if r.dtype == d]
            w_ok, w_why, w_none = whole_blocks(mine)
            ok.update(w_ok)
            why.update(w_why)
            figs["per_dtype"][d] = {"whole_block": {"n": len(w_ok), "k": sum(w_ok.values()), "no_hit": w_none},
                                    "partial": changes(mine, PARTIAL, conf),
                                    "cross_request": changes(mine, CROSS, conf)}
        figs["lines"] = [line(d, f) for d, f in figs["per_dtype"].items()]
        bad = [u for u, good in ok.items() if not good]
        n, k = len(ok), len(ok) - len(bad)
        if bad:
            return self.result(FAIL, n, k, f"whole-block hits differ from the request that wrote them on "
                               f"{names(f'{u} ({why[u]})' for u in bad)}", figs, bad)
        if n < ev.thresholds["min_units"]:
            return self.result(INCONCLUSIVE, n, k, f"{n} whole-block hits, needs {int(ev.thresholds['min_units'])}",
                               figs)
        return self.result(PASS, n, k, f"whole-block hits reproduce the live request bit for bit on {k}/{n}", figs)

    def key_figure(self, result: ClaimResult) -> str:
        return " | ".join(result.figures.get("lines") or []) or result.reason

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        out = {}
        for d, f in (figures.get("per_dtype") or {}).items():
            for shape in ("partial", "cross_request"):
                k, n = f[shape]["suffix_changes_vs_live"]
                out[f"{shape}_suffix_changes_vs_live[{d}]"] = (k, n)
        return out

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        lines = (result.get("figures") or {}).get("lines") or [result["reason"]]
        return section(self.name, self.title, table(["verdict", "k/n", "per precision"], [
            [status(result["status"]), f"{result['k']}/{result['n']}", "<br>".join(e(x) for x in lines)]]))


def line(dtype: str, f: Mapping[str, Any]) -> str:
    """``prefix cache (bf16): whole-block hits reproduce N/N; partial hits change k/n suffixes (rate [interval]), j
    labels; cross-request ...``: the terminal's one line per precision."""
    w, p, c = f["whole_block"], f["partial"], f["cross_request"]

    def shape(name: str, s: Mapping[str, Any]) -> str:
        k, n = s["suffix_changes_vs_live"]
        iv = s["suffix_changes_vs_live_ci"]
        rate = f"{k / n:.0%} [{iv[0]:.0%}, {iv[1]:.0%}]" if n else "no hits"
        return f"{name} hits change {k}/{n} suffixes ({rate}), {s['label_changes_vs_live'][0]} labels"

    return (f"prefix cache ({dtype}): whole-block hits reproduce {w['k']}/{w['n']}; {shape('partial', p)}; "
            f"{shape('cross-request', c)}")
