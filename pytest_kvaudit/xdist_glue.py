"""pytest-xdist glue: the workers shard out the items, every claim is judged on the whole.

Every worker computes a part of the items (taken one at a time from a queue in a folder the controller
handed out through ``workerinput``, :mod:`pytest_kvaudit.workers.queue`, so that a worker with costly divergent items
does not hold the other up) and writes it, atomically, to that folder. A claim test, on whichever worker it
lands, waits for every part and judges the merged records, so a claim over 200 items is one verdict
whatever ``-n``. A worker that dies leaves a ``.dead`` marker (written by the controller in
``pytest_testnodedown``): the items it computed are reported missing and no claim that needed them can
pass.

Every run imports this module (the plugin settles where its process sits at configure, :func:`place`), so what
only the controller reads (its progress printer, the workers' selection) is imported in the controller's hooks.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import interrupts
from pytest_kvaudit.workers.topology import Topology

if TYPE_CHECKING:
    from pytest_kvaudit.progress import WorkerProgress
    from pytest_kvaudit.workers.stop import StopFlag

SHARD_DIR = "kvaudit_shard_dir"


class XdistController:
    """Registered on the controller only when xdist runs workers."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvaudit-shards-"))
        self.progress: WorkerProgress | None = None
        self.workers = 0  # xdist's worker count, known once the first node is configured
        self.stop: StopFlag | None = None  # the run's stop flag (:mod:`.interrupts`)
        #: the claims a worker selected and the work they need (the controller collects nothing itself)
        self.selection: dict[str, Any] | None = None

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        from pytest_kvaudit.progress import WorkerProgress, printer

        show = printer(session.config)
        if show is not None:  # prints only once workers write progress, i.e. when kvaudit tests run
            self.progress = WorkerProgress(self.dir, show)
            self.progress.start()

    @pytest.hookimpl
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.progress is not None:
            self.progress.close()

    @pytest.hookimpl
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput[SHARD_DIR] = str(self.dir)
        self.workers = int(node.workerinput.get("workercount", self.workers))

    @pytest.hookimpl
    def pytest_testnodedown(self, node: Any, error: object | None) -> None:
        from pytest_kvaudit.settings import SELECTION_KEY

        wid = str(node.workerinput.get("workerid", ""))

        self.selection = self.selection or (getattr(node, "workeroutput", None) or {}).get(SELECTION_KEY)
        interrupted = (getattr(node, "workeroutput", None) or {}).get("exitstatus") == pytest.ExitCode.INTERRUPTED
        if error is None and interrupted and self.stop is not None and self.stop.trip():
            # a worker was interrupted (a signal to it alone, or the run's stop flag): so is the run. Raised here,
            # before xdist counts the worker as crashed, fails the test it held and starts a replacement
            self.stop.request(f"{wid} was interrupted")
            raise KeyboardInterrupt(f"{wid} was interrupted")
        if error is None:
            return
        if wid.startswith("gw"):
            (self.dir / f"worker-{wid[2:]}.dead").write_text(str(error)[:2000])

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def run_folder(config: pytest.Config) -> Path | None:
    """On an xdist worker: the run's shard folder (its stop flag lives there), whatever the worker's index."""
    wi = getattr(config, "workerinput", None)
    return Path(wi[SHARD_DIR]) if wi and SHARD_DIR in wi else None


def worker_place(config: pytest.Config) -> tuple[int, int, Path] | None:
    """(index, count, folder) on an xdist worker that takes part in sharding, else None."""
    wi = getattr(config, "workerinput", None)
    if not wi or SHARD_DIR not in wi:
        return None
    count = int(wi["workercount"])
    index = int(str(wi["workerid"]).removeprefix("gw"))
    # a replacement for a crashed worker has an index past the count: it reads, it computes nothing
    return (index if index < count else -1, count, Path(wi[SHARD_DIR]))


def place(config: pytest.Config, topo: Topology) -> XdistController | None:
    """Where this process sits (``topo.worker``, its stop flag ``topo.stop``), settled at configure in every run,
    one that names no kvaudit option included: the controller hands its shard folder to the workers before anyone
    knows whether they will collect a kvaudit test. Returns the controller's :class:`XdistController`, if this is
    one. Cheap: a folder and two plugin objects, nothing imported."""
    controller, folder = None, None  # the xdist run's shard folder, where its stop flag lives
    if config.pluginmanager.hasplugin("xdist"):
        topo.worker, folder = worker_place(config), run_folder(config)
        if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
            controller = XdistController()
            config.pluginmanager.register(controller, "kvaudit-xdist")
            folder = controller.dir
    topo.stop = interrupts.register(config, folder).flag
    if controller is not None:
        controller.stop = topo.stop
    return controller
