"""The run: its config, the store (built on first use, or merged from xdist shards), and the claims
judged so far. One :class:`KvauditSession` lives on ``config.stash`` and is registered as a plugin."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import verdict_relay as verdicts
from pytest_kvaudit.claims import registered
from pytest_kvaudit.claims.needs import builtin, work
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.runtime.decoder import NO_FAULTS
from pytest_kvaudit.progress import printer, worker_progress
from pytest_kvaudit.report.writers import report_path
from pytest_kvaudit.run_plan import check_covered, claims_plan, price_only
from pytest_kvaudit.selection import claims_of, selected_claims, uses_store
from pytest_kvaudit.workers.lifecycle import Lifecycle
from pytest_kvaudit.workers.topology import Topology

#: where an xdist worker ships its selection to the controller (``workeroutput``)
SELECTION_KEY = "kvaudit_selection"

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim, ClaimResult
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.workers.lifecycle import Lifecycle


@dataclass(eq=False)  # registered as a plugin: pluggy keeps plugins in sets, so it must stay hashable
class KvauditSession:
    """The run's state: what it is asked to do, what it computed and what its claims said."""

    config: AuditConfig
    pytest_config: pytest.Config
    thresholds: dict[str, dict[str, float]]
    #: the report's formats asked for: option -> path (:data:`pytest_kvaudit.report.writers.WRITERS`)
    outputs: dict[str, Path] = field(default_factory=dict)
    baseline: str | None = None
    strict: bool = False  # --kvaudit-strict: inconclusive is a failure
    selection: tuple[str, ...] | None = None  # --kvaudit-claims: None, ("all",), () or names
    analyses: tuple[str, ...] = ()  # --kvaudit-analyses: computed whatever the claims
    store: Store | None = None
    error: str | None = None
    claims: dict[str, ClaimResult] = field(default_factory=dict)
    #: per claim: order, title, key figure and watched rates (and its HTML section when one is asked for)
    display: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)
    #: where this process sits in the run: xdist worker, runner's shard, merge (:mod:`.workers.lifecycle`)
    topology: Topology = field(default_factory=Topology)
    shard_line: str | None = None  # a runner's shard's outcome, for the terminal summary
    gate_line: str | None = None  # why --kvaudit-strict failed a run whose claims passed (unread thresholds)
    controller: Any = None  # the XdistController, on an xdist controller
    started: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)  # one-line warnings for the terminal summary
    plan_only: bool = False  # --kvaudit-plan: price the run, compute nothing beyond the calibration
    plan: dict[str, Any] | None = None  # the plan printed by --kvaudit-plan
    report: dict[str, Any] | None = None  # the run's report, once built at the session's end
    collected_claims: set[str] | None = None  # claims this process collected (None: it collected nothing)
    gate: Any = None  # the baseline gate (:class:`pytest_kvaudit.gate.Gate`), read at configure
    gate_result: dict[str, Any] | None = None  # what the kvaudit::baseline test found (from whichever process ran it)
    identity: dict[str, Any] | None = None  # the run's model shape, items and settings (:mod:`pytest_kvaudit.core.planning.baseline`)
    undeclared: list[str] = field(default_factory=list)  # tests that read the store without a registered claim
    interrupted: bool = False  # the run was interrupted: nothing reports its claims as the run's verdict
    _lifecycle: Lifecycle | None = field(default=None, repr=False)

    # -- the store: its lifecycle lives in workers.lifecycle; here it meets pytest ---------------------
    @property
    def lifecycle(self) -> Lifecycle:
        if self._lifecycle is None:
            faults = self.pytest_config.hook.pytest_kvaudit_faults(config=self.pytest_config) or NO_FAULTS
            self._lifecycle = Lifecycle(self.config, self.topology, faults)
        return self._lifecycle

    def get_store(self) -> Store:
        """The run's store (:meth:`.workers.lifecycle.Lifecycle.obtain`). A runner's shard is not the whole: in a
        ``--kvaudit-shard`` run every kvaudit test skips once the shard is recorded, saying how to judge it."""
        if self.store is None and self.error is None:
            try:
                self.store = self.lifecycle.obtain(self.make_plan, printer(self.pytest_config))
                self.config = self.lifecycle.config  # a merge runs the partials' plan
                if self.store is not None:
                    check_covered(self.selected(), self.store.cfg)
            except KvauditError as exc:
                self.error = str(exc)
        if self.error is not None:
            pytest.fail(self.error, pytrace=False)
        if self.topology.shard is not None:
            i, n = self.topology.shard
            folder = self.topology.partials
            pytest.skip(f"shard {i}/{n} recorded to {folder}: judge with --kvaudit-merge={folder}")
        assert self.store is not None
        return self.store

    # -- what the run selects: its claims decide what the store computes ------------------------------
    def selected(self) -> list[Claim]:
        """The registered claims this run judges (collected, after ``-k`` and ``--kvaudit-claims``), and a
        claim that declares nothing for each test that reads the store without one (it gets everything)."""
        return selected_claims(self.selection, self.collected_claims, self.undeclared)

    def select(self, items: list[pytest.Item]) -> None:
        """After collection (on each xdist worker alike, whose collections xdist checks are equal): the claims
        the run's tests judge, and the work they need into the run's config (``AuditConfig.work``), so that
        every process and every runner's shard computes the same cells and the plan prices only those."""
        readers = [i for i in items if uses_store(i)]
        self.collected_claims, self.undeclared = claims_of(readers, {c.name for c in registered()})
        if readers:
            every = filter(builtin, registered())
            self.config = self.config.replace(work=work(self.selected(), self.config, every, self.analyses))
        out = getattr(self.pytest_config, "workeroutput", None)
        if out is not None:  # the controller prices the plan and recalls its estimate with the workers' selection
            out[SELECTION_KEY] = {"claims": sorted(self.collected_claims), "undeclared": self.undeclared,
                                  "work": None if self.config.work is None else list(self.config.work)}

    def adopt(self, shipped: dict[str, Any] | None) -> None:
        """On the xdist controller, which collects nothing: the selection a worker made (:meth:`select`)."""
        if shipped is None or self.collected_claims is not None:
            return
        self.collected_claims, self.undeclared = set(shipped["claims"]), list(shipped["undeclared"])
        self.config = self.config.replace(work=None if shipped["work"] is None else tuple(shipped["work"]))

    def make_plan(self, store: Store, workers: int, sample: int = 0) -> dict[str, Any]:
        """The run's plan for the claims this run selects (:func:`.run_plan.claims_plan`)."""
        return claims_plan(self.selected(), self.undeclared, self.thresholds, store, workers, sample)

    def plan_run(self, workers: int) -> None:
        """--kvaudit-plan: open the store (nothing computed), calibrate and price the run; the report file, when
        one is asked for, holds the plan block alone."""
        try:
            self.plan = price_only(self.make_plan, self.lifecycle.open(), workers, self.pytest_config, self.config,
                                   report_path(self.outputs))
        except KvauditError as exc:
            self.error = str(exc)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        try:
            self.select(session.items)
        except KvauditError as exc:
            if not hasattr(self.pytest_config, "workerinput"):
                raise pytest.UsageError(str(exc)) from None
            self.error = str(exc)  # a worker cannot stop the run with a usage error: every claim fails with it

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        # a worker computes its shard only when the run holds a kvaudit test: an unrelated -n run costs nothing
        # (a merge computes nothing: its workers merge the partials like a single process would)
        t = self.topology
        if (t.worker is not None and t.merge is None and not session.config.option.collectonly and not self.plan_only
                and any(map(uses_store, session.items))):
            index, _, folder = t.worker
            failed = self.lifecycle.compute_worker(self.make_plan, worker_progress(folder, index), self.error)
            if failed is not None and t.shard is not None:  # a shard's claims skip without merging: fail here
                self.error = failed
        return (yield)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The claims' verdicts, from this process's tests or, on the xdist controller, the workers'."""
        verdicts.collect(self, report)
