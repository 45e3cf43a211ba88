"""The HTML report's words and colours, read from the page as built (no browser: tests/report/test_html_browser.py
lays it out): the run's line on top, values as words, the first differing token marked, AA contrast."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pytest_kvaudit.claims.htmlkit import visible, words
from pytest_kvaudit.report import html
from pytest_kvaudit.report.counterexamples import marked
from pytest_kvaudit.report.document import summary

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted({*REPO.glob("benchmarks/results/**/report*.json"), REPO / "snapshots/embedded/report.json"}
                   - set(REPO.glob("benchmarks/results/**/snapshots/**/report.json")))


def _report(statuses: list[str], backend: str | None = "vllm", regressions: int | None = None) -> dict:
    claims = {f"c{i}": {"status": s, "n": 3, "k": 3, "interval": [0.1, 1.0], "reason": "r", "details": []}
              for i, s in enumerate(statuses)}
    rep: dict = {"model": {"id": "m"}, "items": {"total": 3, "eligible": 3, "ineligible": {"boundary_not_reached": 1}},
                 "claims": claims, "environment": {"backend": backend} if backend else {},
                 "display": {n: {"order": 1, "figure": "f", "rates": {}} for n in claims}}
    if regressions is not None:
        rep["baseline"] = {"path": "b.json", "regressions": regressions, "improvements": 0, "claims": {}}
    return rep


def test_the_run_in_one_line_verdicts_backend_and_gate() -> None:
    rep = _report(["pass", "fail", "pass", "inconclusive", "pass", "pass"], regressions=0)
    assert summary(rep) == "1 FAIL · 1 INCONCLUSIVE · 4 PASS · backend vllm · gate PASSED"
    assert summary(_report(["pass"], backend=None, regressions=2)) == "1 PASS · backend transformers · gate FAILED"
    assert summary(_report([])) == "no claim judged · backend vllm · no baseline gate"
    page = html.render(rep)
    assert "<title>kvaudit report: m on vllm</title>" in page
    line = re.sub("<[^>]+>", "", re.search(r"<p id='summary'.*?</p>", page).group())  # type: ignore[union-attr]
    assert line == summary(rep)
    assert page.index("id='summary'") < page.index("id='claims'")  # the first thing after the heading


def test_values_read_as_words() -> None:
    assert words({"boundary_not_reached": 3}) == "boundary not reached 3"
    assert words(["bf16", "fp32"]) == "bf16, fp32" and words([]) == "none" and words({}) == "none"
    assert words(True) == "yes" and words(False) == "no" and words(None) == "-"
    nested = {"bf16": {"block_size": 32, "isa": "vec"}, "fp32": [3, 32]}
    assert words(nested) == "bf16 (block size 32; isa vec); fp32 (3, 32)"


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_no_python_repr_on_a_committed_report_page(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(html.analysis, "figures", lambda report: [])  # pictures hold no words: not drawn, faster
    page = html.render(json.loads(path.read_text()))
    text = re.sub(r"data:image/png;base64,[^'\"]*", "", page)
    for repr_ in ("[&#x27;", "{&#x27;", ">True<", ">False<", ">None<", "{}<"):
        assert repr_ not in text, (repr_, text[max(0, text.find(repr_) - 200): text.find(repr_) + 80])


def test_the_first_differing_token_is_marked_and_whitespace_shows() -> None:
    a, b = marked(" Raj has 1. He has 6", " Raj has 1. The answer", (" He", " The"))
    assert a == " Raj has 1.<mark> He</mark> has 6" and b == " Raj has 1.<mark> The</mark> answer"
    a, b = marked("x = 2.\nQ", "x = 2. The", ("\n", " The"))  # a whitespace token: drawn, not an empty box
    assert a.startswith("x = 2.<mark><span class='ws'") and "↵" in a and b == "x = 2.<mark> The</mark>"
    a, b = marked("5+6=11;20+8=28", "5+6=11;20+5=25", None)  # tokens not recorded: the character to its word's end
    assert a == "5+6=11;20+<mark>8=28</mark>" and b == "5+6=11;20+<mark>5=25</mark>"
    assert marked("same", "same", None, differ=False) == ("same", "same")
    assert "␣␣" in visible("  ") and visible(" He") == " He"


def _luminance(hexcolour: str) -> float:
    h = hexcolour.lstrip("#")
    h = "".join(c * 2 for c in h) if len(h) == 3 else h
    ch = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in ch]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast(fg: str, bg: str) -> float:
    hi, lo = sorted((_luminance(fg), _luminance(bg)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def test_every_text_colour_meets_wcag_aa_on_every_background() -> None:
    fgs = set(re.findall(r"(?<![-\w])color:(#[0-9a-f]{3,6})", html.CSS))
    bgs = set(re.findall(r"background:(#[0-9a-f]{3,6})", html.CSS)) | {"#fff"}
    assert {"#176117", "#a11"} <= fgs and len(bgs) >= 4
    low = [(f, b, round(contrast(f, b), 2)) for f in fgs for b in bgs if contrast(f, b) < 4.5]
    assert low == []
    assert 4.47 < contrast("#a66a00", "#fff") < 4.5  # INCONCLUSIVE's former colour: this check fails it


@pytest.mark.parametrize("path", sorted(REPO.glob("benchmarks/results/**/report.html")),
                         ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_report_page_is_today_s_with_its_figures(path: Path) -> None:
    """Rebuilt by this renderer (the run's line on top) with matplotlib, so its figures are in it; the screenshots
    beside them are of these pages (scripts/report_screens.py)."""
    page = path.read_text()
    assert "id='summary'" in page and "Figures need matplotlib" not in page
    assert page.count("<img alt=") >= 3 and page.count("src='data:image/png;base64,") >= 3
    stem = "-".join(path.relative_to(REPO / "benchmarks" / "results").with_suffix("").parts).removesuffix("-report")
    for width in (1400, 800):
        assert (REPO / "benchmarks" / "results" / "screens" / f"{stem}-{width}.png").exists(), (stem, width)
