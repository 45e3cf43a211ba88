"""The run: its config, the store (built on first use, or merged from xdist shards), and the claims
judged so far. One :class:`KvauditSession` lives on ``config.stash`` and is registered as a plugin."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit.dist.topology import Topology
from pytest_kvaudit.engine.config import AuditConfig
from pytest_kvaudit.engine.errors import KvauditError

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import ClaimResult
    from pytest_kvaudit.dist.lifecycle import Lifecycle
    from pytest_kvaudit.engine.store import Store


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
    store: Store | None = None
    error: str | None = None
    claims: dict[str, ClaimResult] = field(default_factory=dict)
    #: per claim: order, title, key figure and watched rates (and its HTML section when one is asked for)
    display: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)
    #: where this process sits in the run: xdist worker, runner's shard, merge (:mod:`.dist.lifecycle`)
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
    identity: dict[str, Any] | None = None  # the run's model shape, items and settings (:mod:`.engine.baseline`)
    interrupted: bool = False  # the run was interrupted: nothing reports its claims as the run's verdict
    _lifecycle: Lifecycle | None = field(default=None, repr=False)

    @property
    def report_path(self) -> Path | None:
        """The JSON report's path, when one is asked for."""
        from pytest_kvaudit.report.writers import WRITERS

        return self.outputs.get(WRITERS[0].flag)

    @property
    def wants_sections(self) -> bool:
        """A format that shows the claims' own HTML sections is asked for: the claims render them."""
        from pytest_kvaudit.report.writers import WRITERS

        return any(w.sections and w.flag in self.outputs for w in WRITERS)

    # -- the store: its lifecycle lives in dist.lifecycle; here it meets pytest ---------------------
    @property
    def lifecycle(self) -> Lifecycle:
        if self._lifecycle is None:
            from pytest_kvaudit.dist.lifecycle import Lifecycle
            from pytest_kvaudit.engine.decoder import NO_FAULTS

            faults = self.pytest_config.hook.pytest_kvaudit_faults(config=self.pytest_config) or NO_FAULTS
            self._lifecycle = Lifecycle(self.config, self.topology, faults)
        return self._lifecycle

    def get_store(self) -> Store:
        """The run's store (:meth:`.dist.lifecycle.Lifecycle.obtain`). A runner's shard is not the whole: in a
        ``--kvaudit-shard`` run every kvaudit test skips once the shard is recorded, saying how to judge it."""
        if self.store is None and self.error is None:
            from pytest_kvaudit.progress import printer

            try:
                self.store = self.lifecycle.obtain(self.make_plan, printer(self.pytest_config))
                self.config = self.lifecycle.config  # a merge runs the partials' plan
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

    def make_plan(self, store: Store, workers: int, sample: int = 0) -> dict[str, Any]:
        """The run's plan over the whole item set (:mod:`.engine.plan`), for the claims this run selects: what
        each needs to decide, and the lengths of a run a claim recorded (a ledger), if any."""
        from pytest_kvaudit.claims import least_units, registered
        from pytest_kvaudit.engine.plan import make_plan

        sel, got = self.selection, self.collected_claims
        claims = [c for c in registered() if (c.name in got if got is not None else
                                              sel in (None, ("all",), ()) or c.name in (sel or ()))]
        least = {c.name: least_units(c, self.thresholds.get(c.name, {}), store.cfg) for c in claims}
        ledger = next((p for c in registered() if (p := c.recorded_run(store.cfg)) is not None), None)
        return make_plan(store, least, ledger, workers, sample)

    def plan_run(self, workers: int) -> None:
        """--kvaudit-plan: open the store (nothing computed), calibrate and price the run; the report file, when
        one is asked for, holds the plan block alone."""
        from pytest_kvaudit.engine.calibrate import SAMPLE
        from pytest_kvaudit.engine.estimate import remember

        try:
            self.plan = self.make_plan(self.lifecycle.open(), workers, SAMPLE)
        except KvauditError as exc:
            self.error = str(exc)
            return
        remember(getattr(self.pytest_config, "cache", None), self.config, self.plan)  # the run's end compares
        if self.report_path is not None:
            from pytest_kvaudit.report.document import write

            write({"plan": self.plan, "config": {"dtypes": list(self.config.dtypes)}}, self.report_path)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        # a worker computes its shard only when the run holds a kvaudit test: an unrelated -n run costs nothing
        # (a merge computes nothing: its workers merge the partials like a single process would)
        t = self.topology
        if (t.worker is not None and t.merge is None and not session.config.option.collectonly and not self.plan_only
                and any(map(uses_store, session.items))):
            from pytest_kvaudit.progress import worker_progress

            index, _, folder = t.worker
            failed = self.lifecycle.compute_worker(self.make_plan, worker_progress(folder, index), self.error)
            if failed is not None and t.shard is not None:  # a shard's claims skip without merging: fail here
                self.error = failed
        return (yield)

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The claims' verdicts, from this process's tests or, on the xdist controller, the workers'."""
        from pytest_kvaudit import verdicts

        verdicts.collect(self, report)


def uses_store(item: pytest.Item) -> bool:
    """A kvaudit test: one that reads the store (``kvaudit_judge`` and ``kvaudit_records`` do)."""
    return "kvaudit_store" in getattr(item, "fixturenames", ())
