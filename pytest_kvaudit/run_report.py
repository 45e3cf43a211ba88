"""The run's JSON report, built from what the session gathered: the claims' verdicts (from every worker),
the store's run information, the plan with the estimate a ``--kvaudit-plan`` run left for this same run,
and the comparison with a baseline. Built once, at the session's end."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_kvaudit.engine.config import AuditConfig
    from pytest_kvaudit.engine.store import Store
    from pytest_kvaudit.session import KvauditSession


def plan_block(sess: KvauditSession, plan: dict[str, Any]) -> dict[str, Any]:
    """The run's plan, with the estimate a --kvaudit-plan run left in pytest's cache for this same run."""
    from pytest_kvaudit.engine.estimate import recall

    est = recall(getattr(sess.pytest_config, "cache", None), sess.config, int(plan.get("workers") or 1)) if plan else {}
    return {**plan, "estimate": est} if est else plan


def run_report(sess: KvauditSession) -> dict[str, Any] | None:
    """The report, or None when no claim was judged."""
    from pytest_kvaudit.engine.errors import KvauditError
    from pytest_kvaudit.report.document import build, compare, load_baseline

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
        config={"dtypes": list(sess.config.dtypes), "n": sess.config.n, "seed": sess.config.seed},
        display=sess.display,
    )
    if sess.baseline:
        try:
            rep["baseline"] = {"path": sess.baseline, **compare(load_baseline(Path(sess.baseline)), rep)}
        except KvauditError as exc:
            rep["baseline"] = {"path": sess.baseline, "error": str(exc), "changes": []}
    return rep


def run_info(store: Store, config: AuditConfig) -> dict[str, Any]:
    """What the report needs from the store, as plain data (shipped once to the controller)."""
    from pytest_kvaudit.claims import registered
    from pytest_kvaudit.claims.analyses import build as analyses
    from pytest_kvaudit.claims.needs import minimal_tokens
    from pytest_kvaudit.engine.chat import checkpoint_source, report_block
    from pytest_kvaudit.engine.itemcheck import item_set_name
    from pytest_kvaudit.engine.pricing import price
    from pytest_kvaudit.report.document import items_block

    # the least work is what every registered claim needs, whichever this run selected: the overhead figure
    # must not move with -k
    minimal = sum(minimal_tokens(registered(), list(store.records.values()), store.cfg).values())
    return {
        "analyses": analyses(list(store.records.values()), config.sweep_units),
        "model": store.identity,
        "environment": store.environment,
        "items": {**items_block(store.records.values(), [i.id for i in store.items]), "set": item_set_name(store.item_set),
                  **report_block(config.chat_template, bool(store.cfg.chat_template), checkpoint_source(store.cfg.model))},
        "cost": {"forward_calls": store.cost.forward_calls, "forward_tokens": store.cost.forward_tokens,
                 "minimal_forward_tokens": minimal, "seconds": store.cost.seconds, "stages": dict(store.stages)},
        # the plan's model of the work applied to the lengths the run produced: equal to cost.forward_tokens
        "plan": {**store.plan, "priced_after_run": price(store.records.values())} if store.plan else {},
    }
