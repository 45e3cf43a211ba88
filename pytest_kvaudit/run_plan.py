"""The run's plan as the pytest side asks for it: the selected claims' rows over the engine's plan
(:mod:`pytest_kvaudit.core.planning.plan`), ``--kvaudit-plan`` alone, and the merge's check that its shards computed
what its claims read. No pytest here: the session hands in what it selected."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from pytest_kvaudit.claims import least_units, registered
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import computes
from pytest_kvaudit.core.planning.calibrate import SAMPLE
from pytest_kvaudit.core.planning.estimate import remember
from pytest_kvaudit.core.planning.plan import ClaimAsks, make_plan
from pytest_kvaudit.report.document import write


def check_covered(claims: Sequence[Any], cfg: AuditConfig) -> None:
    """A merge judges what its shards computed: a selected claim that applies to the run and whose needs they did not
    compute is an error."""
    for c in claims:
        if hasattr(c, "applicable") and c.applicable(cfg) is not None:
            continue  # a claim that does not apply to this run (no prefix cache here) reads nothing and is skipped
        lacking = [n for n in (c.needs or ("everything",)) if cfg.work is not None and not computes(cfg.work, n)]
        if lacking:
            raise KvauditError(f"claim {getattr(c, 'name', 'of a test reading the store')} needs {', '.join(lacking)}, "
                               f"which the run it judges did not compute (it computed {', '.join(cfg.work or ())}): "
                               "give the shards the same --kvaudit-claims, -k and test paths as the merge")


def claims_plan(selected: Sequence[Any], undeclared: Sequence[str], thresholds: dict[str, dict[str, float]], store: Any,
                workers: int, sample: int = 0) -> dict[str, Any]:
    """The run's plan over the whole item set (:mod:`pytest_kvaudit.core.planning.plan`), for the claims this run
    selects: what each needs to decide, whether it can run here, what n a strict gate needs of it, and the lengths of a
    run a claim recorded (a ledger), if any. A test that reads the store without a claim gets a row too."""
    claims = [c for c in selected if hasattr(c, "name")]
    th = {c.name: c.resolve(store.cfg, thresholds.get(c.name, {})) for c in claims}
    least = {c.name: least_units(c, thresholds.get(c.name, {}), store.cfg) for c in claims}
    ledger = next((p for c in registered() if (p := c.recorded_run(store.cfg)) is not None), None)
    asks = ClaimAsks(least, {c.name: c.applicable(store.cfg) for c in claims},
                     {c.name: partial(c.strict_needs, th[c.name]) for c in claims})
    plan = make_plan(store, asks, ledger, workers, sample)
    for c in claims:
        plan["claims"][c.name]["reads"] = "everything" if c.needs is None else list(c.needs)
    for name in undeclared:
        plan["claims"][name] = {"decides": "not declared", "needs": {}, "strict": {"n": None, "by": {}},
                                "reads": "everything (a test reading the store, no Claim class)"}
    return plan


def price_only(make: Callable[..., dict[str, Any]], store: Any, workers: int, pytest_config: Any, config: AuditConfig,
               report_path: Path | None) -> dict[str, Any]:
    """--kvaudit-plan: calibrate and price the run on an opened store; remembered for the run's end to
    compare, and written alone to the JSON report when one is asked for."""
    plan = make(store, workers, SAMPLE)
    remember(getattr(pytest_config, "cache", None), config, plan)
    if report_path is not None:
        write({"plan": plan, "config": {"dtypes": list(config.dtypes)}}, report_path)
    return plan
