"""The claims' least evidence, and the table a researcher reads: pure functions, no model."""

from __future__ import annotations

import json
import math

from pytest_kvaudit.claims import ClaimResult, least_units, registered
from pytest_kvaudit.claims.rules import least_units_below, rate_decision
from pytest_kvaudit.report.document import dumps
from pytest_kvaudit.report.terminal import detail_line, fmt_interval, lines


def test_least_units_for_an_exact_upper_bound() -> None:
    assert least_units_below(0.02) == 183  # the paper's 0/200 clears 2% with 17 units to spare (Wilson: 189)
    assert rate_decision(0, 183, 0.02)[2] <= 0.02 < rate_decision(0, 182, 0.02)[2]
    n = least_units_below(0.02, k=2)
    assert n is not None and rate_decision(2, n, 0.02)[2] <= 0.02 < rate_decision(2, n - 1, 0.02)[2]
    assert least_units_below(0.0) is None


def test_every_claim_says_what_it_needs() -> None:
    needs = {c.name: least_units(c) for c in registered()}
    assert "layer_sweep" not in needs  # an analysis now, not a claim
    assert needs["fixed_prefix_2x2"] == {"units_per_high_precision": 183, "divergent_units_per_low_precision": 10}
    assert least_units("fixed_prefix_2x2", {"max_rate": 0.5})["units_per_high_precision"] == 6
    assert needs["matched_construction"] == {"eligible_items_per_precision": 20, "label_rate": 0.8,
                                             "right_items_per_side": 10, "wrong_items_per_side": 10}
    assert needs["replica_exactness"] == {"replica_pairs": 12}
    assert needs["donor_following"] == {"divergent_units_per_direction": 10}
    assert needs["bridge_bitexact"] == {"items_x_precisions": 12}


def report_with(claim: ClaimResult, statistic: str = "Wilson 95% CI of k/n") -> dict:
    return {"model": {"id": "m", "architecture": "A", "num_layers": 2, "weights_digest": "sha256:0"},
            "items": {"total": 0, "eligible": 0, "ineligible": {}},
            "claims": {claim.name: claim.to_dict()},
            "display": {claim.name: {"order": 1, "figure": "fig", "statistic": statistic, "rates": {}}}}


def test_a_statistic_over_nothing_is_a_dash_and_null() -> None:
    r = ClaimResult("matched_construction", "inconclusive", 0, 0, (-math.inf, math.inf), "no units",
                    {"accuracy_diff_ci": {"bf16": [-math.inf, math.inf]}, "p": math.nan})
    d = r.to_dict()
    assert d["interval"] == [None, None] and d["figures"] == {"accuracy_diff_ci": {"bf16": [None, None]}, "p": None}
    text = dumps(report_with(r))
    assert "Infinity" not in text and "NaN" not in text
    assert ClaimResult.from_dict(json.loads(json.dumps(d))).n == 0
    row = next(x for x in lines(report_with(r, "bootstrap 95% CI Δacc bf16")) if x.startswith("matched_construction"))
    assert row.split()[:4] == ["matched_construction", "INCONCLUSIVE", "0", "0"] and " - " in row
    assert fmt_interval([0.0, 1.0]) == "[0.000, 1.000]" and fmt_interval([None, None]) == "-"


def test_the_table_names_its_columns_and_shows_three_counterexamples() -> None:
    det = [{"unit": f"t0{i}@bf16", "a": "live", "b": "prefill", "position": 3, "margin_a": 0.03125, "margin_b": 0.0,
            "text_a": "3+7=10;10+1=11|A11", "text_b": "3+7=10;10+4=14|A11"} for i in range(5)]
    r = ClaimResult("matched_construction", "pass", 10, 5, (-0.01, 0.02), "ok", {}, [], det)
    out = lines(report_with(r, "bootstrap 95% CI Δacc bf16"))
    head = next(x for x in out if x.startswith("claim"))
    assert head.split() == ["claim", "verdict", "n", "k", "interval", "statistic"]
    row = next(x for x in out if x.startswith("matched_construction"))
    assert "bootstrap 95% CI Δacc bf16" in row and "[-0.010, +0.020]" in row
    assert out[out.index(row) + 1].split() == ["└", "fig"]  # the key figure beneath its row
    shown = [x for x in out if "t0" in x and "@bf16" in x]
    assert len(shown) == 3 and any("and 2 more" in x for x in out)
    assert detail_line(det[0]) == ("t00@bf16 pos 3, margin 0.03125/0: live '…7=10;10+1=11|A11' vs "
                                   "prefill '…7=10;10+4=14|A11'")
