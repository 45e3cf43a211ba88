"""Verdicts on their way to the report: each claim's result, display and the run's information ride in the
test report's user properties, which pytest (and xdist, from a worker to the controller) carries without
extra code; the controller collects them here."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from pytest_kvaudit.claims.base import ClaimResult

CLAIM_PROP, DISPLAY_PROP, RUN_PROP = "kvaudit_claim", "kvaudit_display", "kvaudit_run"
GATE_PROP = "kvaudit_gate"


@dataclass
class Verdicts:
    """What the run said: its claims' verdicts (from every worker), how each shows, the store's run information
    they ride with, and the lines and report the run ends with."""

    claims: dict[str, ClaimResult] = field(default_factory=dict)
    #: per claim: order, title, key figure and watched rates (and its HTML section when one is asked for)
    display: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one-line warnings for the terminal summary
    plan: dict[str, Any] | None = None  # the plan printed by --kvaudit-plan
    report: dict[str, Any] | None = None  # the run's report, once built at the session's end
    shard_line: str | None = None  # a runner's shard's outcome, for the terminal summary
    strict_line: str | None = None  # why --kvaudit-strict failed a run whose claims passed (unread thresholds)
    interrupted: bool = False  # the run was interrupted: nothing reports its claims as the run's verdict


def record(book: Verdicts, result: ClaimResult, display: dict[str, Any], node: pytest.Item,
           info: Callable[[], dict[str, Any]]) -> None:
    """Keep a verdict and ship it in the test report, which xdist carries to the controller, with the store's run
    information (``info``: empty where this process holds no store)."""
    book.claims[result.name] = result
    book.display[result.name] = display
    node.user_properties.append((CLAIM_PROP, json.dumps(result.to_dict(), default=list)))
    node.user_properties.append((DISPLAY_PROP, json.dumps({"name": result.name, **display})))
    if not book.run_info:
        book.run_info = info()
    if book.run_info:
        node.user_properties.append((RUN_PROP, json.dumps(book.run_info, default=list)))


def collect(book: Verdicts, report: pytest.TestReport) -> dict[str, Any] | None:
    """Collect claim results from test reports: the controller sees the workers' claims under xdist. Returns what
    the ``kvaudit::baseline`` test found (its ledger comparison), when ``report`` is its call's."""
    props = dict(report.user_properties)
    found = json.loads(str(props[GATE_PROP])) if GATE_PROP in props and report.when == "call" else None
    if CLAIM_PROP not in props or report.when == "teardown":
        return found

    result = ClaimResult.from_dict(json.loads(str(props[CLAIM_PROP])))
    book.claims[result.name] = result
    if DISPLAY_PROP in props:
        d = json.loads(str(props[DISPLAY_PROP]))
        book.display[d.pop("name")] = d
    if RUN_PROP in props and not book.run_info:
        book.run_info = json.loads(str(props[RUN_PROP]))
    return found
