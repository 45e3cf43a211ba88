"""Verdicts on their way to the report: each claim's result, display and the run's information ride in the
test report's user properties, which pytest (and xdist, from a worker to the controller) carries without
extra code; the controller collects them here."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Protocol

import pytest

from pytest_kvaudit.claims.base import ClaimResult
from pytest_kvaudit.session_report import run_info

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim, ClaimResult
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig


class VerdictBook(Protocol):
    """Where a run keeps its verdicts (the session is one): what this module reads and writes of it."""

    config: AuditConfig
    store: Store | None
    claims: dict[str, ClaimResult]
    display: dict[str, dict[str, Any]]
    run_info: dict[str, Any]
    gate_result: dict[str, Any] | None

    def selected(self) -> list[Claim]: ...

CLAIM_PROP, DISPLAY_PROP, RUN_PROP = "kvaudit_claim", "kvaudit_display", "kvaudit_run"
GATE_PROP = "kvaudit_gate"


def record(sess: VerdictBook, result: ClaimResult, display: dict[str, Any], node: pytest.Item) -> None:
    """Keep a verdict and ship it in the test report, which xdist carries to the controller."""
    sess.claims[result.name] = result
    sess.display[result.name] = display
    node.user_properties.append((CLAIM_PROP, json.dumps(result.to_dict(), default=list)))
    node.user_properties.append((DISPLAY_PROP, json.dumps({"name": result.name, **display})))
    if sess.store is not None and not sess.run_info:
        sess.run_info = run_info(sess.store, sess.config, sess.selected())
    if sess.run_info:
        node.user_properties.append((RUN_PROP, json.dumps(sess.run_info, default=list)))


def collect(sess: VerdictBook, report: pytest.TestReport) -> None:
    """Collect claim results from test reports: the controller sees the workers' claims under xdist."""
    props = dict(report.user_properties)
    if GATE_PROP in props and report.when == "call":  # the kvaudit::baseline test's ledger comparison
        sess.gate_result = json.loads(str(props[GATE_PROP]))
    if CLAIM_PROP not in props or report.when == "teardown":
        return

    result = ClaimResult.from_dict(json.loads(str(props[CLAIM_PROP])))
    sess.claims[result.name] = result
    if DISPLAY_PROP in props:
        d = json.loads(str(props[DISPLAY_PROP]))
        sess.display[d.pop("name")] = d
    if RUN_PROP in props and not sess.run_info:
        sess.run_info = json.loads(str(props[RUN_PROP]))
