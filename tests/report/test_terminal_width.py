"""The terminal's claims table fits 120 columns on every committed report: the statistic wraps in its column and
the key figure, reason and counterexamples go on the lines beneath a row."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_kvaudit.report.terminal import LEGEND, WIDTH, claims_table, lines

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted({*REPO.glob("benchmarks/results/**/report*.json"), REPO / "snapshots/embedded/report.json"}
                   - set(REPO.glob("benchmarks/results/**/snapshots/**/report.json")))


def _table(out: list[str]) -> list[str]:
    start = next(i for i, x in enumerate(out) if x.startswith("claim "))
    end = next(i for i, x in enumerate(out) if LEGEND.startswith(x))
    return out[start:end + 2]


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_the_claims_table_fits_120_columns(path: Path) -> None:
    report = json.loads(path.read_text())
    table = _table(lines(report))
    assert WIDTH == 120 and max(len(x) for x in table) <= 120, max(table, key=len)
    for name, c in report["claims"].items():  # nothing dropped: each row, its figure or reason beneath
        assert any(x.startswith(f"{name} ") and c["status"].upper() in x for x in table)


def test_a_long_figure_and_statistic_wrap_under_their_row() -> None:
    fig = "differing layers bf16 " + ",".join(map(str, range(1, 80))) + " in /a/very/long/path/" + "x" * 150
    report = {"claims": {"c": {"status": "fail", "n": 394, "k": 369, "interval": [0.005, 0.041], "reason": "why " * 40,
                               "details": []}},
              "display": {"c": {"order": 1, "figure": fig, "statistic": "exact McNemar; Tango 95% CI Δacc bf16 " * 3,
                                "rates": {}}}}
    out = claims_table(report)
    assert max(map(len, out)) <= 120
    assert out[1].startswith("c ") and "FAIL" in out[1] and "[+0.005, +0.041]" in out[1]
    beneath = [x for x in out if x.lstrip().startswith("└")]
    assert len(beneath) == 2  # the key figure, then the reason
    assert "".join(x.strip() for x in out).count("x") >= 150  # a path is broken, not cut
