"""The run's JSON report, built from what the session gathered: the claims' verdicts (from every worker),
the store's run information, the plan with the estimate a ``--kvaudit-plan`` run left for this same run,
and the comparison with a baseline. Built once, at the session's end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from pytest_kvaudit.claims import registered
from pytest_kvaudit.claims.analyses import build as analyses
from pytest_kvaudit.claims.needs import minimal_tokens
from pytest_kvaudit.core.cost.pricing import price
from pytest_kvaudit.core.planning.estimate import recall
from pytest_kvaudit.core.runtime.itemcheck import item_set_name
from pytest_kvaudit.report.comparison import compare
from pytest_kvaudit.report.document import build, items_block

if TYPE_CHECKING:
    from collections.abc import Sequence

    import pytest

    from pytest_kvaudit.claims.base import Claim
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.gate import Gate
    from pytest_kvaudit.settings import Settings
    from pytest_kvaudit.verdict_relay import Verdicts
    from pytest_kvaudit.workers.lifecycle import Lifecycle


class ReportSession(Protocol):
    """What the report reads of the run (the session is one): its settings, verdicts, identity and baseline."""

    pytest_config: pytest.Config
    settings: Settings
    run: Lifecycle
    verdicts: Verdicts
    gate: Gate | None


def plan_block(sess: ReportSession, plan: dict[str, Any]) -> dict[str, Any]:
    """The run's plan, with the estimate a --kvaudit-plan run left in pytest's cache for this same run."""
    cache = getattr(sess.pytest_config, "cache", None)
    est = recall(cache, sess.run.config, int(plan.get("workers") or 1)) if plan else {}
    return {**plan, "estimate": est} if est else plan


def run_report(sess: ReportSession) -> dict[str, Any] | None:
    """The report, or None when no claim was judged. The run's identity is the one its lifecycle computed once
    (:meth:`pytest_kvaudit.workers.lifecycle.Lifecycle.identity`), which the gate checked at configure."""
    said, cfg = sess.verdicts, sess.run.config
    if not said.claims:
        return None
    info = said.run_info or {}
    rep = build(
        info.get("model", {}),
        info.get("environment", {}),
        info.get("items", {"total": 0, "eligible": 0, "ineligible": {}}),
        said.claims,
        info.get("cost", {}),
        analyses=info.get("analyses", {}),
        plan=plan_block(sess, info.get("plan", {})),
        config={"dtypes": list(cfg.dtypes), "n": cfg.n, "seed": cfg.seed, "identity": sess.run.identity()},
        display=said.display,
    )
    gate = sess.gate
    if gate is not None:
        rep["baseline"] = {"path": sess.settings.baseline, **compare(gate.report, rep, gate.rules, gate.result)}
    return rep


def run_info(store: Store, config: AuditConfig, claims: Sequence[Claim] | None = None) -> dict[str, Any]:
    """What the report needs from the store, as plain data (shipped once to the controller); ``claims``: the
    run's selected claims (:meth:`.settings.Selection.claims`; default every registered one)."""
    # the least work is what the claims this run selected need (they decide what it computes, cfg.work)
    minimal = sum(minimal_tokens(registered() if claims is None else claims, list(store.records.values()),
                                 store.cfg).values())
    return {
        "analyses": analyses(list(store.records.values()), config.sweep_units),
        "model": store.identity,
        "environment": store.environment,
        "items": {**items_block(store.records.values(), [i.id for i in store.items]),
                  "set": item_set_name(store.item_set),
                  **store.item_set.chat, "stop_regex": store.item_set.stop_regex},
        "cost": {"forward_calls": store.cost.forward_calls, "forward_tokens": store.cost.forward_tokens,
                 "minimal_forward_tokens": minimal, "seconds": store.cost.seconds, "stages": dict(store.stages)},
        # the plan's model of the work applied to the lengths the run produced: equal to cost.forward_tokens
        "plan": {**store.plan, "priced_after_run": price(store.records.values())} if store.plan else {},
    }
