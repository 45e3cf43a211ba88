"""The store's lifecycle over the processes of one run, apart from pytest.

A run's store comes from one of four places, decided by the run's :class:`Topology`:

* computed here (one process, ``-n 0``);
* computed by xdist workers, each taking items from the shared queue and writing its export, then merged in
  a single run's order (:meth:`Lifecycle.compute_worker`, :meth:`Lifecycle.obtain`);
* a runner's shard (``--kvaudit-shard=I/N``), computed here or by its workers and written as a partial;
* merged from every runner's partial (``--kvaudit-merge``), computing nothing.

The pytest side only joins this to pytest: which process it is, the faults hook, progress printing, and
turning an error into a test outcome.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.compute.progress import Progress
from pytest_kvaudit.core.compute.store import Store
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.gate.identity import partial_identity, run_identity
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.runtime.decoder import NO_FAULTS, Faults
from pytest_kvaudit.core.runtime.itemcheck import item_set_name
from pytest_kvaudit.core.runtime.torch_settings import prepare
from pytest_kvaudit.workers.exports import export, finish_shard, write_export, write_export_error, write_partial
from pytest_kvaudit.workers.merge import merge_exports, merge_partials
from pytest_kvaudit.workers.partials import PARTIAL_RE
from pytest_kvaudit.workers.queue import WorkQueue
from pytest_kvaudit.workers.topology import Topology

#: (store, workers) -> the run's plan block, priced before the store computes
PlanFn = Callable[[Store, int], dict[str, Any]]


def _no_faults() -> Faults:
    return NO_FAULTS


@dataclass
class Lifecycle:
    """One run's store, obtained once, whichever process this is; the run's config (the work its claims select,
    a merge's partials' plan) and its identity live here, beside the store they open."""

    config: AuditConfig
    topology: Topology
    #: asked once, when the store first opens: a conftest's faults hook is registered by then
    faults: Callable[[], Faults] = _no_faults
    written: Path | None = None  # the partial this runner wrote
    store: Store | None = None  # the store the claims judge, once obtained
    error: str | None = None  # why this process has no store (every claim fails with it)
    _identity: dict[str, Any] | None = field(default=None, repr=False)
    _faults: Faults | None = field(default=None, repr=False)

    def open(self) -> Store:
        """The run's store, nothing computed yet, with torch set up for this process."""
        index = self.topology.worker[0] if self.topology.worker is not None else None
        if self._faults is None:
            self._faults = self.faults()
        return Store.open(prepare(self.config, index), self._faults, self.topology.shard or (0, 1))

    def identity(self, strict: bool = False) -> dict[str, Any]:
        """The run's model shape, items and settings, computed once, as a later run's ``--kvaudit-baseline`` checks
        them before it loads anything: from config.json (or a GGUF header) and the item file, or a merge's
        partials. Empty where they cannot be read back (a hub checkpoint offline), unless ``strict`` (the gate's
        check) raises."""
        if self._identity is None:
            merge = self.topology.merge
            try:
                if merge is None:
                    self._identity = run_identity(self.config)
                else:
                    files = sorted(p for p in merge.rglob("partial-*.json") if PARTIAL_RE.fullmatch(p.name))
                    if not files:
                        raise KvauditError(f"--kvaudit-merge={merge}: no partial-I-of-N.json under it")
                    self._identity = partial_identity(json.loads(files[0].read_text(encoding="utf-8")))
            except (KvauditError, OSError, ValueError):
                if strict:
                    raise
                self._identity = {}
        return self._identity

    def obtain(self, plan: PlanFn, progress: Progress | None) -> Store | None:
        """The store the claims judge: merged from the runners' partials, merged from the xdist workers'
        exports, or computed here (a runner's shard is also written as its partial). None on an xdist worker
        of a runner's shard: its part went into the export that the partial is written from."""
        t = self.topology
        if t.merge is not None:
            self.config, store = merge_partials(self.config, t.merge)
            return store
        if t.worker is not None:
            return None if t.shard is not None else merge_exports(self.config, t.worker[1], t.worker[2], t.stop)
        store = self.open()
        store.plan = plan(store, 1)
        store.compute(progress=progress)
        if t.shard is not None:
            assert t.partials is not None
            self.written = write_partial(t.partials, t.shard, [export(store, item_set_name(store.item_set))])
        return store

    def compute_worker(self, plan: PlanFn, progress: Progress, error: str | None) -> str | None:
        """On an xdist worker, before any test: take items from the queue until none is left and write this
        worker's export (or the run's usage ``error``, so every worker's claims fail with it). Returns the
        error that ends this worker's part, if any.

        Divergent items cost several times a plain one, so the workers take items one at a time from a shared
        queue rather than fixed shards; records are merged back into a single run's order by
        :func:`pytest_kvaudit.workers.merge.merged`, whoever computed them."""
        assert self.topology.worker is not None
        index, count, folder = self.topology.worker
        if index < 0:
            return None
        if error is not None:
            write_export_error(folder, index, error)
            return error
        try:
            store = self.open()
            if index == 0:  # one worker prices the whole run
                store.plan = plan(store, count)
            queue = WorkQueue(folder, index, len(store.items), stop=self.topology.stop)
            store.compute(progress=progress, queue=queue, nominal=WorkQueue.nominal(len(store.items), index, count))
            data = export(store, item_set_name(store.item_set)) if self.topology.shard is not None else store.export()
            write_export(folder, index, data)
        except KvauditError as exc:
            write_export_error(folder, index, str(exc))
            return str(exc)
        return None

    def finish_shard(self, worker_folder: Path | None, workers: int, error: str | None) -> str:
        """On the process that owns a runner's shard: its partial, written from the xdist workers' exports
        when there are any; returns the summary line, starting with "FAILED" when nothing was written."""
        t = self.topology
        assert t.shard is not None and t.partials is not None
        line, self.written = finish_shard(t.shard, t.partials, self.written, error, worker_folder, workers)
        return line
