"""The run: its config, the store (built on first use, or merged from xdist shards), and the claims
judged so far. One :class:`KvauditSession` lives on ``config.stash`` and is registered as a plugin."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit.engine.config import AuditConfig
from pytest_kvaudit.engine.errors import KvauditError

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import ClaimResult
    from pytest_kvaudit.engine.store import Store

CLAIM_PROP, DISPLAY_PROP, RUN_PROP = "kvaudit_claim", "kvaudit_display", "kvaudit_run"


@dataclass(eq=False)  # registered as a plugin: pluggy keeps plugins in sets, so it must stay hashable
class KvauditSession:
    """The run's state: what it is asked to do, what it computed and what its claims said."""

    config: AuditConfig
    pytest_config: pytest.Config
    thresholds: dict[str, dict[str, float]]
    report_path: Path | None = None
    html_path: Path | None = None
    baseline: str | None = None
    strict: bool = False  # --kvaudit-strict: inconclusive is a failure
    selection: tuple[str, ...] | None = None  # --kvaudit-claims: None, ("all",), () or names
    store: Store | None = None
    error: str | None = None
    claims: dict[str, ClaimResult] = field(default_factory=dict)
    #: per claim: order, title, key figure and watched rates (and its HTML section when one is asked for)
    display: dict[str, dict[str, Any]] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)
    shard: tuple[int, int, Path] | None = None  # (index, count, folder) on a sharding xdist worker
    share: tuple[int, int] | None = None  # --kvaudit-shard=I/N: this runner computes share I of N
    partials: Path | None = None  # --kvaudit-partials: where the share's partial goes
    merge: Path | None = None  # --kvaudit-merge: judge the partials under this folder, compute nothing
    written: Path | None = None  # the partial this run wrote
    share_line: str | None = None  # the share's outcome, for the terminal summary
    controller: Any = None  # the XdistController, on an xdist controller
    started: float = field(default_factory=time.perf_counter)
    notes: list[str] = field(default_factory=list)  # one-line warnings for the terminal summary
    plan_only: bool = False  # --kvaudit-plan: price the run, compute nothing beyond the calibration
    plan: dict[str, Any] | None = None  # the plan printed by --kvaudit-plan
    report: dict[str, Any] | None = None  # the run's report, once built at the session's end
    collected_claims: set[str] | None = None  # claims this process collected (None: it collected nothing)

    # -- the store -----------------------------------------------------------------------------
    def get_store(self) -> Store:
        """The run's store: computed here, merged from every xdist worker's shard, or from every runner's
        partial. A share is not the whole: in a ``--kvaudit-shard`` run every kvaudit test skips once the share
        is recorded, saying how to judge it."""
        if self.store is None and self.error is None:
            try:
                if self.merge is not None:
                    self.store = self._merge_partials()
                elif self.share is not None and self.shard is None:
                    self.store = self._compute()
                    self.written = self._write_partial([self.export(self.store)])
                elif self.share is None:
                    self.store = self._merge_shards() if self.shard else self._compute()
            except KvauditError as exc:
                self.error = str(exc)
        if self.error is not None:
            pytest.fail(self.error, pytrace=False)
        if self.share is not None:
            i, n = self.share
            pytest.skip(f"shard {i}/{n} recorded to {self.partials}: judge with --kvaudit-merge={self.partials}")
        assert self.store is not None
        return self.store

    def export(self, store: Store) -> dict[str, Any]:
        from pytest_kvaudit.dist.exports import export

        return export(store, item_set_name(store))

    def _write_partial(self, exports: list[dict[str, Any]]) -> Path:
        from pytest_kvaudit.dist.exports import write_partial

        assert self.share is not None and self.partials is not None
        return write_partial(self.partials, self.share, exports)

    def finish_share(self, shard_dir: Path | None, workers: int) -> str:
        """On the process that owns the run (not an xdist worker): the partial, written from the xdist workers'
        shards when there are any; returns the summary line, starting with "FAILED" when nothing was written."""
        from pytest_kvaudit.dist.exports import finish_share

        assert self.share is not None and self.partials is not None
        line, self.written = finish_share(self.share, self.partials, self.written, self.error, shard_dir, workers)
        return line

    def _open(self) -> Store:
        import torch

        from pytest_kvaudit.engine.decoder import NO_FAULTS
        from pytest_kvaudit.engine.store import Store

        # One CPU thread per process by default: thread count changes the bits of CPU matmuls, and
        # verdicts must not depend on -n. --kvaudit-threads trades that for speed.
        torch.set_num_threads(self.config.threads or 1)
        cfg = self.config
        if cfg.tf32 is not None:  # recorded in the environment block, so ledgers of the two settings differ
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
            torch.backends.cudnn.allow_tf32 = cfg.tf32
        if self.shard is not None and cfg.device == "auto" and cfg.device_map is None and torch.cuda.is_available():
            # one GPU per worker: worker i takes GPU i mod the number of GPUs
            cfg = cfg.replace(device=f"cuda:{max(0, self.shard[0]) % torch.cuda.device_count()}")
        faults = self.pytest_config.hook.pytest_kvaudit_faults(config=self.pytest_config) or NO_FAULTS
        return Store.open(cfg, faults, self.share or (0, 1))

    def _compute(self) -> Store:
        from pytest_kvaudit.progress import printer

        store = self._open()
        store.plan = self.make_plan(store, 1)
        store.compute(progress=printer(self.pytest_config))
        return store

    def make_plan(self, store: Store, workers: int, sample: int = 0) -> dict[str, Any]:
        """The run's plan over the whole item set (:mod:`.plan`), for the claims this run selects."""
        from pytest_kvaudit.claims import registered
        from pytest_kvaudit.engine.plan import make_plan

        sel, got = self.selection, self.collected_claims
        claims = [c for c in registered() if (c.name in got if got is not None else
                                              sel in (None, ("all",), ()) or c.name in (sel or ()))]
        return make_plan(store, claims, self.thresholds, workers, sample)

    def plan_run(self, workers: int) -> None:
        """--kvaudit-plan: open the store (nothing computed), calibrate and price the run; the report file, when
        one is asked for, holds the plan block alone."""
        try:
            from pytest_kvaudit.engine.plan import SAMPLE

            self.plan = self.make_plan(self._open(), workers, SAMPLE)
        except KvauditError as exc:
            self.error = str(exc)
            return
        from pytest_kvaudit.engine.plan import remember

        remember(getattr(self.pytest_config, "cache", None), self.config, self.plan)  # the run's end compares
        if self.report_path is not None:
            from pytest_kvaudit.engine.files import atomic_write_text
            from pytest_kvaudit.report.document import dumps

            atomic_write_text(self.report_path, dumps({"plan": self.plan, "config": {"dtypes": list(self.config.dtypes)}}))

    def compute_shard(self) -> None:
        """On an xdist worker, before any test: compute this worker's part and hand it to the others.

        The workers take items one at a time from a queue in the shard folder (work stealing,
        :mod:`.workqueue`) rather than a fixed round-robin shard: divergent items cost several times a plain
        one, so fixed shares leave one worker waiting for the other. Records are merged back into a single
        run's order by :meth:`Store.merged`, whoever computed them."""
        from pytest_kvaudit.dist.exports import write_shard, write_shard_error

        assert self.shard is not None
        index, count, folder = self.shard
        if index < 0:
            return
        if self.error is not None:  # a usage error found at collection: every worker's claims fail with it
            write_shard_error(folder, index, self.error)
            return
        from pytest_kvaudit.dist.queue import WorkQueue
        from pytest_kvaudit.progress import shard_writer

        try:
            store = self._open()
            if index == 0:  # one worker prices the whole run
                store.plan = self.make_plan(store, count)
            queue = WorkQueue(folder, index, len(store.items))
            store.compute(progress=shard_writer(folder, index), queue=queue,
                          nominal=WorkQueue.nominal(len(store.items), index, count))
            write_shard(folder, index, self.export(store) if self.share is not None else store.export())
        except KvauditError as exc:
            write_shard_error(folder, index, str(exc))
            if self.share is not None:  # a share's claims skip without merging: they fail with the error here
                self.error = str(exc)

    def _merge_shards(self) -> Store:
        from pytest_kvaudit.dist.exports import merge_shards

        assert self.shard is not None
        return merge_shards(self.config, self.shard[1], self.shard[2])

    def _merge_partials(self) -> Store:
        from pytest_kvaudit.dist.exports import merge_partials

        assert self.merge is not None
        self.config, store = merge_partials(self.config, self.merge)
        return store

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Threshold lines for claims that no collected file registered.

        A user's claim is registered when its test file is imported, so only now are all names known, and
        only for the files this run collected. When the run collected its default tree (testpaths or the
        current folder) every claim of the project is registered: an unknown name is a typo and a usage
        error. When the command line named paths, the claim may live in a file not collected: the line is
        unused, so it is named in the summary rather than refused. On an xdist worker, which cannot stop
        the run with a usage error, it fails every claim test with the same one line.
        """
        if not self.thresholds:
            return
        from pytest_kvaudit import options as opt
        from pytest_kvaudit.claims import registered

        try:
            unknown = opt.check_thresholds(self.thresholds, self.config, registered())
            if not unknown:
                return
            msg = opt.unknown_claims_message(unknown, registered())
            if self.pytest_config.args_source == pytest.Config.ArgsSource.ARGS:
                self.notes.append(f"{msg}; the line was not used")
                return
            raise pytest.UsageError(msg)
        except pytest.UsageError as exc:
            if not hasattr(self.pytest_config, "workerinput"):
                raise
            self.error = str(exc)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        # a worker computes its shard only when the run holds a kvaudit test: an unrelated -n run costs nothing
        # (a merge computes nothing: its workers merge the partials like a single process would)
        if (self.shard is not None and self.merge is None and not session.config.option.collectonly and not self.plan_only
                and any(map(uses_store, session.items))):
            self.compute_shard()
        return (yield)

    # -- the claims ----------------------------------------------------------------------------
    def record(self, result: ClaimResult, display: dict[str, Any], node: pytest.Item) -> None:
        """Keep a verdict and ship it in the test report, which xdist carries to the controller."""
        self.claims[result.name] = result
        self.display[result.name] = display
        node.user_properties.append((CLAIM_PROP, json.dumps(result.to_dict(), default=list)))
        node.user_properties.append((DISPLAY_PROP, json.dumps({"name": result.name, **display})))
        if self.store is not None and not self.run_info:
            self.run_info = run_info(self.store, self.config)
        if self.run_info:
            node.user_properties.append((RUN_PROP, json.dumps(self.run_info, default=list)))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect claim results from test reports: the controller sees the workers' claims under xdist."""
        props = dict(report.user_properties)
        if CLAIM_PROP not in props or report.when == "teardown":
            return
        from pytest_kvaudit.claims.base import ClaimResult

        result = ClaimResult.from_dict(json.loads(str(props[CLAIM_PROP])))
        self.claims[result.name] = result
        if DISPLAY_PROP in props:
            d = json.loads(str(props[DISPLAY_PROP]))
            self.display[d.pop("name")] = d
        if RUN_PROP in props and not self.run_info:
            self.run_info = json.loads(str(props[RUN_PROP]))


def item_set_name(store: Store) -> str:
    """The item set as a report names it: its file, or the built-in set's name."""
    from pytest_kvaudit.engine.config import EMBEDDED_DIR, EMBEDDED_NAME

    path = store.item_set.path
    p = str(path)
    if p.startswith("<") and p.endswith(">"):
        return p[1:-1]
    return f"{EMBEDDED_NAME}:{path.name}" if path.resolve().parent == EMBEDDED_DIR.resolve() else p


def uses_store(item: pytest.Item) -> bool:
    """A kvaudit test: one that reads the store (``kvaudit_judge`` and ``kvaudit_records`` do)."""
    return "kvaudit_store" in getattr(item, "fixturenames", ())


def run_info(store: Store, config: AuditConfig) -> dict[str, Any]:
    """What the report needs from the store, as plain data (shipped once to the controller)."""
    from pytest_kvaudit.claims.analyses import build as analyses
    from pytest_kvaudit.engine.pricing import price
    from pytest_kvaudit.report.document import items_block

    return {
        "analyses": analyses(list(store.records.values()), config.sweep_units),
        "model": store.identity,
        "environment": store.environment,
        "items": {**items_block(store.records.values(), [i.id for i in store.items]), "set": item_set_name(store)},
        "cost": {**{k: getattr(store.cost, k) for k in ("forward_calls", "forward_tokens", "minimal_forward_tokens",
                                                        "seconds")}, "stages": dict(store.stages)},
        # the plan's model of the work applied to the lengths the run produced: equal to cost.forward_tokens
        "plan": {**store.plan, "priced_after_run": price(store.records.values())} if store.plan else {},
    }
