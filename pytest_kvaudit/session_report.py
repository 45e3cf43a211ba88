"""The run's JSON report, built from what the session gathered: the claims' verdicts (from every worker),
the store's run information, the plan with the estimate a ``--kvaudit-plan`` run left for this same run,
and the comparison with a baseline. Built once, at the session's end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from pytest_kvaudit.claims import registered
from pytest_kvaudit.claims.analyses import build as analyses
from pytest_kvaudit.claims.needs import minimal_tokens
from pytest_kvaudit.core.cost.pricing import price
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.planning.baseline import partial_identity, run_identity
from pytest_kvaudit.core.planning.estimate import recall
from pytest_kvaudit.core.runtime.itemcheck import item_set_name
from pytest_kvaudit.report.comparison import compare
from pytest_kvaudit.report.document import build, items_block
from pytest_kvaudit.workers.partials import PARTIAL_RE

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pytest

    from pytest_kvaudit.claims.base import Claim, ClaimResult
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.workers.topology import Topology


class ReportSession(Protocol):
    """What the report reads of the run (the session is one): its settings, verdicts and baseline."""

    config: AuditConfig
    pytest_config: pytest.Config
    claims: dict[str, ClaimResult]
    display: dict[str, dict[str, Any]]
    run_info: dict[str, Any]
    baseline: str | None
    gate: Any
    gate_result: dict[str, Any] | None
    identity: dict[str, Any] | None
    topology: Topology


def plan_block(sess: ReportSession, plan: dict[str, Any]) -> dict[str, Any]:
    """The run's plan, with the estimate a --kvaudit-plan run left in pytest's cache for this same run."""
    est = recall(getattr(sess.pytest_config, "cache", None), sess.config, int(plan.get("workers") or 1)) if plan else {}
    return {**plan, "estimate": est} if est else plan


def run_report(sess: ReportSession) -> dict[str, Any] | None:
    """The report, or None when no claim was judged."""
    if not sess.claims:
        return None
    info = sess.run_info or {}
    rep = build(
        info.get("model", {}),
        info.get("environment", {}),
        info.get("items", {"total": 0, "eligible": 0, "ineligible": {}}),
        sess.claims,
        info.get("cost", {}),
        analyses=info.get("analyses", {}),
        plan=plan_block(sess, info.get("plan", {})),
        config={"dtypes": list(sess.config.dtypes), "n": sess.config.n, "seed": sess.config.seed,
                "identity": identity(sess)},
        display=sess.display,
    )
    if sess.gate is not None:
        rep["baseline"] = {"path": sess.baseline, **compare(sess.gate.report, rep, sess.gate.rules, sess.gate_result)}
    return rep


def identity(sess: ReportSession, strict: bool = False) -> dict[str, Any]:
    """The run's model shape, items and settings, as a later run's ``--kvaudit-baseline`` checks them before it
    loads anything: from config.json (or a GGUF header) and the item file, or a merge's partials. Empty where
    they cannot be read back (a hub checkpoint offline), unless ``strict`` (the gate's check) raises."""
    import json

    if sess.identity is None:
        merge = sess.topology.merge
        try:
            if merge is None:
                sess.identity = run_identity(sess.config)
            else:
                files = sorted(p for p in merge.rglob("partial-*.json") if PARTIAL_RE.fullmatch(p.name))
                if not files:
                    raise KvauditError(f"--kvaudit-merge={merge}: no partial-I-of-N.json under it")
                sess.identity = partial_identity(json.loads(files[0].read_text(encoding="utf-8")))
        except (KvauditError, OSError, ValueError):
            if strict:
                raise
            sess.identity = {}
    return sess.identity


def run_info(store: Store, config: AuditConfig, claims: Sequence[Claim] | None = None) -> dict[str, Any]:
    """What the report needs from the store, as plain data (shipped once to the controller); ``claims``: the
    run's selected claims (:meth:`.session.KvauditSession.selected`; default every registered one)."""
    # the least work is what the claims this run selected need (they decide what it computes, cfg.work)
    minimal = sum(minimal_tokens(registered() if claims is None else claims, list(store.records.values()),
                                 store.cfg).values())
    return {
        "analyses": analyses(list(store.records.values()), config.sweep_units),
        "model": store.identity,
        "environment": store.environment,
        "items": {**items_block(store.records.values(), [i.id for i in store.items]), "set": item_set_name(store.item_set),
                  **store.item_set.chat, "stop_regex": store.item_set.stop_regex},
        "cost": {"forward_calls": store.cost.forward_calls, "forward_tokens": store.cost.forward_tokens,
                 "minimal_forward_tokens": minimal, "seconds": store.cost.seconds, "stages": dict(store.stages)},
        # the plan's model of the work applied to the lengths the run produced: equal to cost.forward_tokens
        "plan": {**store.plan, "priced_after_run": price(store.records.values())} if store.plan else {},
    }
