"""The bisected layer sweep: the search finds the known threshold in O(log n) transplants, the sweep stays far
below the old ~90 subsets on 30 layers, and the analysis reads its points in numeric layer order."""

from __future__ import annotations

import math
import re

import pytest

from pytest_kvaudit.claims.layer_sweep import layer_sweep
from pytest_kvaudit.core.compute.transplants import Switches, continuations
from pytest_kvaudit.core.model import sweep as sw
from pytest_kvaudit.core.model.records import CellRecord, Transplant

#: what the exhaustive sweep (every single layer, every bottom-j and top-j, K only, V only) tried each way on 30
OLD_SUBSETS_30 = 30 + 2 * 28 + 2


@pytest.mark.parametrize(("n", "threshold"), [(30, 7), (30, 1), (30, 30), (30, 29), (80, 41), (2, 1), (2, 2), (1, 1)])
def test_the_search_finds_the_threshold_in_log_n_tries(n: int, threshold: int) -> None:
    asked: list[int] = []

    def follows(j: int) -> bool:
        asked.append(j)
        return j >= threshold

    assert sw.smallest_following(n, follows) == threshold
    assert len(asked) == len(set(asked)) <= sw.search_tries(n) == (math.ceil(math.log2(n)) if n > 1 else 0)
    assert all(0 < j < n for j in asked)  # the ends are known: own cache (0) and the all-layer transplant (n)


def test_a_non_monotone_predicate_still_gives_an_observed_edge() -> None:
    """Follow at 7 and from 20 on, not in between: whatever j comes back follows and j - 1 does not."""
    outcome = {j: j == 7 or j >= 20 for j in range(31)}
    j = sw.smallest_following(30, outcome.__getitem__)
    assert outcome[j] and not outcome[j - 1]


def run_sweep(n: int, bottom_at: int, top_at: int, whole: bool = True) -> tuple[dict[str, int | None], list[sw.Subset]]:
    tried: list[sw.Subset] = []

    def transplant(subset: sw.Subset) -> bool:
        tried.append(subset)
        layers, parts = subset
        if layers is None:
            return parts == "kv"
        if layers == sw.bottom(len(layers), n):
            return len(layers) >= bottom_at
        return layers == sw.top(len(layers), n) and len(layers) >= top_at

    return sw.sweep(n, whole, transplant), tried


def test_the_sweep_on_30_layers_tries_a_dozen_subsets_not_90() -> None:
    found, tried = run_sweep(30, 7, 12)
    assert found == {"bottom": 7, "top": 12}
    assert len(tried) == len(set(tried)) <= sw.sweep_tries_max(30) == 2 * 5 + 2 == 12 <= OLD_SUBSETS_30 // 7
    assert (None, "k") in tried and (None, "v") in tried
    assert (sw.bottom(7, 30), "kv") in tried and (sw.bottom(6, 30), "kv") in tried  # the edge, both sides observed
    # the plan's bound per unit: all layers, the sweep, shams and identical-layer controls, both ways where they go
    assert continuations(Switches(sweep=True), 30) == 2 * (1 + 12) + 4 < 2 * (1 + OLD_SUBSETS_30) + 4


def test_small_models_get_every_single_layer_and_unfollowed_ones_no_search() -> None:
    found, tried = run_sweep(6, 2, 1)
    assert found == {"bottom": 2, "top": 1}
    assert {((i,), "kv") for i in range(6)} <= set(tried) and len(tried) == len(set(tried))
    found, tried = run_sweep(30, 7, 12, whole=False)
    assert found == {"bottom": None, "top": None} and tried == [(None, "k"), (None, "v")]


def record(item: str, n: int, bottom_at: int, top_at: int) -> CellRecord:
    """A divergent unit whose receivers follow once ``bottom_at`` bottom or ``top_at`` top layers come over,
    swept by the engine's own search (both directions alike)."""
    r = CellRecord(item, "bf16", (1,), (2, 3), 1, None, "0")
    r.comparison.drift = [[i, 0.0, 0.0, 0.0, 0.0] for i in range(n)]
    for d in ("live_to_prefill", "prefill_to_live"):
        r.transplants.append(Transplant(d, None, "kv", (5,), True))

        def transplant(subset: sw.Subset, d: str = d) -> bool:
            layers, parts = subset
            k = len(layers or ())
            ok = layers is not None and (layers == sw.bottom(k, n) and k >= bottom_at or layers == sw.top(k, n)
                                         and k >= top_at)
            r.transplants.append(Transplant(d, layers, parts, (5,), ok))
            return ok

        sw.sweep(n, True, transplant)
    return r


def test_the_analysis_reads_layers_in_numeric_order_and_infers_the_rest() -> None:
    recs = [record("a", 30, 7, 12), record("b", 30, 11, 3)]
    out = layer_sweep(recs)
    assert out["n_layers"] == 30
    assert [(m["unit"], m["bottom"], m["top"]) for m in out["minimal"]] == [
        ("a@bf16", 7, 12), ("a@bf16", 7, 12), ("b@bf16", 11, 3), ("b@bf16", 11, 3)]
    assert all(m["tried"] <= sw.sweep_tries_max(30) for m in out["minimal"])
    assert out["sufficient_bottom"] == 11 and out["sufficient_top"] == 12
    up = out["curves"]["from_bottom"]
    assert [p["layers"] for p in up] == list(range(1, 31))
    assert [p["rate"] for p in up[5:12]] == [0.0, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0]  # j = 6..12
    assert all(p["known"] == 4 and p["tried"] + p["inferred"] == 4 for p in up)
    assert up[-1]["tried"] == 4 and sum(p["inferred"] for p in up) > sum(p["tried"] for p in up)
    rows = out["subsets"]
    kv = [r for r in rows if r["parts"] == "kv"]
    keys = [(len(r["layers"]) if r["layers"] else 31, r["layers"][0] if r["layers"] else -1) for r in kv]
    assert keys == sorted(keys) and kv[-1]["subset"] == "all:kv"
    assert [r["subset"] for r in rows[len(kv):]] == ["all:k", "all:v"]
    # tried on all four pairs and followed on each: the first halves, then all layers (smallest, first layer first)
    assert out["sufficient"] == [sw_label(sw.bottom(15, 30)), sw_label(sw.top(15, 30)), "all:kv"]
    assert out["minimal_sufficient"] == {"subset": sw_label(sw.bottom(15, 30)), "layers": list(range(15))}


def sw_label(layers: tuple[int, ...]) -> str:
    return ",".join(map(str, layers)) + ":kv"


def test_rows_and_singles_sort_by_number_not_by_string() -> None:
    r = record("a", 12, 5, 5)
    for layer in (10, 2, 11, 1):  # as a string "10" < "2"
        r.transplants.append(Transplant("live_to_prefill", (layer,), "kv", (6,), False))
    out = layer_sweep([r])
    assert [s["layer"] for s in out["singles"]] == [1, 2, 10, 11]
    singles = [row["layers"][0] for row in out["subsets"] if row["layers"] and len(row["layers"]) == 1]
    assert singles == [1, 2, 10, 11] and out["subsets"][0]["layers"] == [1]  # the searches never went below 3
    assert not out["subsets"][0]["on_every_unit"]  # tried in one direction of one unit only: not "sufficient"


def test_singles_come_in_layer_order() -> None:
    out = layer_sweep([record("a", 8, 3, 1)])
    assert [s["layer"] for s in out["singles"]] == list(range(8))
    assert out["singles"][7]["followed"] == 2 and out["singles"][0]["followed"] == 0
    assert out["minimal_sufficient"] == {"subset": "7:kv", "layers": [7]}


def test_the_html_lists_the_sweep_in_numeric_order_and_draws_its_curves_at_80_layers() -> None:
    from pytest_kvaudit.report import figures

    sweep = layer_sweep([record("a", 80, 9, 70), record("b", 80, 33, 2)])
    html = figures._sweep_section(sweep)
    shown = [int(m) for m in re.findall(r"<td>0\u2013\d+ \((\d+) layers\): kv</td>", html)]
    assert len(shown) >= 5 and shown == sorted(shown)  # by size: "0-9 (10 layers)" never before "0-1 (2 layers)"
    assert "<td>a@bf16</td><td>live to prefill</td><td>9</td><td>70</td>" in html
    pytest.importorskip("matplotlib")
    report = {"analyses": {"anatomy": {}, "layer_sweep": sweep}}
    assert "fig-layer-sweep" in [fid for fid, _, _ in figures.figures(report)]
    assert "fig-layer-sweep" not in [fid
                                     for fid, _, _ in figures.figures({"analyses": {"layer_sweep": layer_sweep([])}})]


class Scripted:
    """A decoder that emits ``script`` one token a step and counts its forwards."""

    eos_ids = frozenset({0})
    stop = None  # no item set's stop rule: the suffix runs to its budget, EOS or the departure

    def __init__(self, script: tuple[int, ...]) -> None:
        self.script, self.calls = script, 0

    def step(self, ids: list[int], state: object) -> object:
        import torch

        logits = torch.zeros(8)
        logits[self.script[self.calls]] = 1.0
        self.calls += 1
        return logits


@pytest.mark.parametrize(("follow", "calls"), [((3, 4, 5, 6), 5), ((3, 4, 7, 6, 5, 4), 3), ((3, 4, 5, 6, 7, 1), 6),
                                               (None, 6)])
def test_a_sweep_point_stops_decoding_where_it_departs_from_the_donor(
        follow: tuple[int, ...] | None, calls: int) -> None:
    from pytest_kvaudit.core.runtime.decoder import continue_greedy

    dec = Scripted((3, 4, 5, 6, 7, 1, 2))
    suffix, _ = continue_greedy(dec, None, 9, 6, [], follow)  # type: ignore[arg-type]
    assert dec.calls == len(suffix) == calls  # one forward a suffix token, none after the outcome is decided
    full = (3, 4, 5, 6, 7, 1)
    assert (suffix == follow) == (full == follow)  # the stop never changes whether the receiver follows
    assert suffix == full[:calls]
