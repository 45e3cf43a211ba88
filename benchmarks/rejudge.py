"""Every committed report judged again by today's decision rules from the counts it recorded, and re-rendered in
place: its JSON (with ``rules_version`` and the verdicts it had before), the HTML beside it, and its terminal
summary (``summary.txt``, by the code that prints one in a run). A run's own terminal log is the record of that run
and stays as it ran, with one line on top naming the summary that supersedes its verdicts. Each claim re-judges
its own result (:func:`pytest_kvaudit.report.rerender.rejudged`); ``tests/project/test_committed_reports.py``
fails when a committed report's verdicts differ from what today's rules give on its counts.

    python benchmarks/rejudge.py     # rewrites the reports; writes benchmarks/results/rejudged.txt and .json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pytest_kvaudit.claims.rules import RULES_VERSION
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.report import html, terminal
from pytest_kvaudit.report.document import dumps
from pytest_kvaudit.report.rerender import rejudged, verdicts

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
#: committed reports outside benchmarks/results: the embedded checkpoint's shipped run
ALSO = (REPO / "snapshots" / "embedded" / "report.json",)
NOTE = (f"# kvaudit's summary below is this run's as printed under the rules of its day; today's verdicts "
        f"(rules_version {RULES_VERSION}), re-judged from the recorded counts by benchmarks/rejudge.py, are in "
        "{summary}.")


def committed_reports() -> list[Path]:
    """Every committed JSON report: a file with the report's schema version and claims."""
    found = []
    for path in sorted([*RESULTS.rglob("*.json"), *ALSO]):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and "schema_version" in data and isinstance(data.get("claims"), dict):
            found.append(path)
    return found


def in_snapshots(report: Path) -> bool:
    """A report kept in a snapshots folder (the shipped embedded run, or a ledger's copy of its run's report)."""
    return "snapshots" in report.relative_to(REPO).parts


def summary_path(report: Path) -> Path:
    return report.with_name("summary.txt" if report.name == "report.json" else f"{report.stem}-summary.txt")


def logs_of(report: Path) -> list[Path]:
    """The pytest terminal logs of the run that wrote ``report``: ``X.txt`` beside ``X.json``, and for
    ``report[-Y].json`` its run's ``terminal[-Y].txt`` (or ``out.txt``)."""
    stem = report.stem
    names = [f"{stem}.txt"]
    if stem.startswith("report"):
        names += [f"terminal{stem[len('report'):]}.txt", *(["out.txt"] if stem == "report" else [])]
    return [report.with_name(n) for n in names if report.with_name(n).exists()]


def note_logs(report: Path, summary: Path) -> None:
    """Put the superseding line on top of each terminal log of ``report``'s run that printed a kvaudit summary."""
    for log in logs_of(report):
        text = log.read_text()
        if "kvaudit claims" not in text or text.startswith("# kvaudit's summary below"):
            continue
        atomic_write_text(log, NOTE.format(summary=summary.name) + "\n" + text)


def render(path: Path) -> dict[str, Any]:
    """Re-judge one report and rewrite its JSON, HTML (where the run wrote one) and summary; its before and after."""
    old = json.loads(path.read_text())
    new = rejudged(old)
    atomic_write_text(path, dumps(new))
    page = path.with_suffix(".html")
    if page.exists():
        atomic_write_text(page, html.render(new))
    if not in_snapshots(path):  # a snapshot folder's copy of a report: its run's folder has the summary
        summary = summary_path(path)
        head = (f"# The claims table of {path.name}, rendered from it by pytest_kvaudit.report.terminal.lines (the "
                f"code that prints it in a run), judged by rules_version {RULES_VERSION} from the counts the run "
                "recorded (python benchmarks/rejudge.py).")
        atomic_write_text(summary, "\n".join([head, *terminal.lines(new)]) + "\n")
        note_logs(path, summary)
    return {"before": new.get("rerendered", {}).get("verdicts_before") or {k: v[0] for k, v in verdicts(old).items()},
            "now": verdicts(new)}


def lines(results: dict[str, Any]) -> list[str]:
    out = []
    for name, row in results.items():
        out.append(f"== {name}")
        for claim, (status, per) in sorted(row["now"].items()):
            was = row["before"].get(claim)
            change = "" if was == status else f"   (was {was})"
            detail = ", ".join(f"{d} {v}" for d, v in per.items())
            out.append(f"  {claim:<22} {status:<13}{change}" + (f"   [{detail}]" if detail else ""))
    return out


def main() -> int:
    results = {str(p.relative_to(REPO)): render(p) for p in committed_reports()}
    atomic_write_text(RESULTS / "rejudged.json", json.dumps(results, indent=2, sort_keys=True) + "\n")
    text = [f"Committed reports judged by today's rules (rules_version {RULES_VERSION}) from their recorded counts and "
            "re-rendered in place (python benchmarks/rejudge.py); 'was': the verdict the report carried before", "",
            *lines(results)]
    atomic_write_text(RESULTS / "rejudged.txt", "\n".join(text) + "\n")
    print("\n".join(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
