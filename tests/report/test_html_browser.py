"""The HTML report in a real browser (headless Chromium): it fits a 1,400 and an 800 px window and every figure
loads. Skips, saying so, where Chromium is not installed; CI (``.ci/run``) installs it and sets
``KVAUDIT_REQUIRE_CHROMIUM=1``, under which a missing Chromium fails instead. About 2 s per page and width."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

from pytest_kvaudit.report import html

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("report_screens", REPO / "scripts" / "report_screens.py")
assert _spec is not None and _spec.loader is not None
screens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(screens)

#: the widest pages the committed results make: a 30-layer model's layer lists and long analyses (SmolLM2), and
#: the embedded checkpoint's counterexamples, texts with no space to break at, under a baseline gate
REPORTS = {"smollm2": "benchmarks/results/smollm2-v3/report.json", "embedded-gate": "snapshots/embedded/report.json"}


@pytest.fixture(scope="module")
def browser() -> None:
    if screens.chromium() is None:
        if os.environ.get("KVAUDIT_REQUIRE_CHROMIUM") == "1":
            pytest.fail("KVAUDIT_REQUIRE_CHROMIUM=1 but chromium is not installed: apt-get install -y chromium")
        pytest.skip("chromium is not installed (apt-get install -y chromium; CI installs it): the HTML report is "
                    "not checked in a browser here")


def _gate(report: dict) -> dict:
    """The report under a baseline gate that found a regression, so the page carries the gate's banner and tables."""
    return {**report, "baseline": {
        "path": "snapshots/embedded-baseline-with-a-long-name/", "model_was": report["model"].get("weights_digest"),
        "rules": "divergence:increase,labels:increase,trajectories:change,verdicts:worse", "regressions": 1,
        "improvements": 0, "claims": {n: {"was": c, "now": c, "kind": None} for n, c in report["claims"].items()},
        "ledger": None}}


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_a_report_fits_the_window_and_loads_its_figures(browser: None, name: str, tmp_path: Path) -> None:
    report = json.loads((REPO / REPORTS[name]).read_text())
    if name.endswith("gate"):
        report = _gate(report)
    page = tmp_path / "report.html"
    html.write(report, page)
    for width, m in screens.measure_widths(page).items():
        assert screens.problems(m) == [], (width, m)
        assert m["window"] == width
        if html.analysis.pyplot() is not None:  # with the report extra the page carries its figures, all loaded
            assert m["images"] >= 3, m


def test_the_check_fails_on_a_page_too_wide_and_on_an_image_that_does_not_load(browser: None,
                                                                                tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<!doctype html><html><body><p>fits</p><table><tr><td>" + "1,2,3," * 400 + "</td></tr></table>"
                    "<img alt='a figure that is gone' src='data:image/png;base64,AAAA'></body></html>")
    said = screens.problems(screens.measure(page, 800))
    assert len(said) == 2 and said[0].startswith("the page is ") and "in a 800 px window: table" in said[0]
    assert said[1] == "1 of 1 images did not load: a figure that is gone"
