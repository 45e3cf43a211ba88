"""The run, split by job: what it is asked (:class:`Settings`), what it selects (:class:`Selection`), the
store's lifecycle with the run's config and identity (:class:`.workers.lifecycle.Lifecycle`), what its claims
said (:class:`.verdict_relay.Verdicts`) and the baseline gate (:class:`.gate.Gate`). One :class:`KvauditSession`
holds them (:mod:`.settings` the first two), lives on ``config.stash`` and is registered as a plugin."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import verdict_relay as verdicts
from pytest_kvaudit.claims import registered
from pytest_kvaudit.claims.needs import builtin, work
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.progress import printer, worker_progress
from pytest_kvaudit.report.writers import report_path
from pytest_kvaudit.run_plan import check_covered, claims_plan, price_only
from pytest_kvaudit.selection import claims_of, uses_store
from pytest_kvaudit.session_report import run_info
from pytest_kvaudit.settings import SELECTION_KEY, Selection, Settings
from pytest_kvaudit.verdict_relay import Verdicts
from pytest_kvaudit.workers.lifecycle import Lifecycle

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.gate import Gate
    from pytest_kvaudit.xdist_glue import XdistController


@dataclass(eq=False)  # registered as a plugin: pluggy keeps plugins in sets, so it must stay hashable
class KvauditSession:
    """The run's state, one object a job."""

    pytest_config: pytest.Config
    settings: Settings
    #: the store, its error, the run's config and identity, and where this process sits (``run.topology``)
    run: Lifecycle
    selection: Selection = field(default_factory=Selection)
    verdicts: Verdicts = field(default_factory=Verdicts)
    gate: Gate | None = None  # the baseline gate, read at configure
    controller: XdistController | None = None  # on an xdist controller

    @property
    def config(self) -> AuditConfig:
        """The run's config, as the lifecycle holds it (the selected work in, a merge's plan once merged)."""
        return self.run.config

    def get_store(self) -> Store:
        """The run's store (:meth:`.workers.lifecycle.Lifecycle.obtain`). A runner's shard is not the whole: in a
        ``--kvaudit-shard`` run every kvaudit test skips once the shard is recorded, saying how to judge it."""
        run = self.run
        if run.store is None and run.error is None:
            try:
                run.store = run.obtain(self.make_plan, printer(self.pytest_config))
                if run.store is not None:
                    check_covered(self.selected(), run.store.cfg)
            except KvauditError as exc:
                run.error = str(exc)
        if run.error is not None:
            pytest.fail(run.error, pytrace=False)
        if run.topology.shard is not None:
            i, n = run.topology.shard
            folder = run.topology.partials
            pytest.skip(f"shard {i}/{n} recorded to {folder}: judge with --kvaudit-merge={folder}")
        assert run.store is not None
        return run.store

    def run_info(self) -> dict[str, Any]:
        """The store's run information for the report (computed once, on the process that holds the store)."""
        if not self.verdicts.run_info and self.run.store is not None:
            self.verdicts.run_info = run_info(self.run.store, self.config, self.selected())
        return self.verdicts.run_info

    # -- what the run selects: its claims decide what the store computes ------------------------------
    def selected(self) -> list[Claim]:
        """The claims this run judges (:meth:`Selection.claims`)."""
        return self.selection.claims()

    def select(self, items: list[pytest.Item]) -> None:
        """After collection (on each xdist worker alike, whose collections xdist checks are equal): the claims
        the run's tests judge, and the work they need into the run's config (``AuditConfig.work``), so that
        every process and every runner's shard computes the same cells and the plan prices only those."""
        sel = self.selection
        readers = [i for i in items if uses_store(i)]
        sel.collected, sel.undeclared = claims_of(readers, {c.name for c in registered()})
        if readers:
            every = filter(builtin, registered())
            self.run.config = self.config.replace(work=work(sel.claims(), self.config, every, self.settings.analyses))
        out = getattr(self.pytest_config, "workeroutput", None)
        if out is not None:  # the controller prices the plan and recalls its estimate with the workers' selection
            out[SELECTION_KEY] = {"claims": sorted(sel.collected), "undeclared": sel.undeclared,
                                  "work": None if self.config.work is None else list(self.config.work)}

    def adopt(self, shipped: dict[str, Any] | None) -> None:
        """On the xdist controller, which collects nothing: the selection a worker made (:meth:`select`)."""
        sel = self.selection
        if shipped is None or sel.collected is not None:
            return
        sel.collected, sel.undeclared = set(shipped["claims"]), list(shipped["undeclared"])
        self.run.config = self.config.replace(work=None if shipped["work"] is None else tuple(shipped["work"]))

    def make_plan(self, store: Store, workers: int, sample: int = 0) -> dict[str, Any]:
        """The run's plan for the claims this run selects (:func:`.run_plan.claims_plan`)."""
        return claims_plan(self.selected(), self.selection.undeclared, self.settings.thresholds, store, workers, sample)

    def plan_run(self, workers: int) -> None:
        """--kvaudit-plan: open the store (nothing computed), calibrate and price the run; the report file, when
        one is asked for, holds the plan block alone."""
        try:
            self.verdicts.plan = price_only(self.make_plan, self.run.open(), workers, self.pytest_config, self.config,
                                            report_path(self.settings.outputs))
        except KvauditError as exc:
            self.run.error = str(exc)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        try:
            self.select(session.items)
        except KvauditError as exc:
            if not hasattr(self.pytest_config, "workerinput"):
                raise pytest.UsageError(str(exc)) from None
            self.run.error = str(exc)  # a worker cannot stop the run with a usage error: every claim fails with it

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        # a worker computes its shard only when the run holds a kvaudit test: an unrelated -n run costs nothing
        # (a merge computes nothing: its workers merge the partials like a single process would)
        t = self.run.topology
        if (t.worker is not None and t.merge is None and not session.config.option.collectonly
                and not self.settings.plan_only and any(map(uses_store, session.items))):
            index, _, folder = t.worker
            failed = self.run.compute_worker(self.make_plan, worker_progress(folder, index), self.run.error)
            if failed is not None and t.shard is not None:  # a shard's claims skip without merging: fail here
                self.run.error = failed
        return (yield)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The claims' verdicts, from this process's tests or, on the xdist controller, the workers'."""
        found = verdicts.collect(self.verdicts, report)
        if found is not None and self.gate is not None:
            self.gate.result = found
