"""Ctrl-C, SIGTERM and an interrupt that reaches one process of an xdist run: the run ends soon and cleanly.

pytest turns SIGINT into its interrupted summary (exit status 2) in the process that receives it. Under
xdist a CI cancel or ``kill -INT <pid>`` reaches the controller alone, or one worker alone; the others
would compute on until xdist kills them ten seconds into its teardown (a kill mid-write leaves temporary
files). So every process of the run shards a :class:`~pytest_kvaudit.workers.stop.StopFlag` in the shard
folder: the process that is interrupted raises it, the workers watch it and stop through their own Ctrl-C
path, and the controller ends with pytest's summary. SIGTERM (what CI cancels send first) is Ctrl-C too.
"""

from __future__ import annotations

import signal
import threading
import warnings
from collections.abc import Generator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from pytest_kvaudit.selection import uses_store
from pytest_kvaudit.workers.stop import StopFlag, Watcher

#: syrupy's warning at the end of an xdist run whose workers did not report; an interrupted run's workers
#: never do, and under ``filterwarnings = error`` it would replace the interrupted summary with a traceback
SYRUPY_INCOMPLETE = r"syrupy: received \d+ of \d+ xdist worker snapshot reports"


class Interrupts:
    """Registered in every process. ``role`` is ``controller`` or ``worker`` (xdist; ``folder`` is the run's
    shard folder) or ``single`` (one process: no folder, SIGTERM handled once a kvaudit test is collected)."""

    def __init__(self, role: str, folder: Path | None, name: str) -> None:
        self.role, self.name = role, name
        self.flag = StopFlag(folder)
        self.watcher: Watcher | None = None
        self._previous: dict[int, Any] = {}  # the handlers this process had before kvaudit's
        self.session: pytest.Session | None = None
        self.late: str | None = None  # a signal that arrived after the tests had run
        self.active = role != "single"  # a single process only once it collected a kvaudit test

    # -- signals ----------------------------------------------------------------------------------
    def _install(self, signums: tuple[int, ...]) -> bool:
        if threading.current_thread() is not threading.main_thread():
            return False  # only the main thread may set handlers (and receive their KeyboardInterrupt)
        for s in signums:
            if s not in self._previous:
                self._previous[s] = signal.signal(s, self._on_signal)
        return True

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The first interrupt of this process raises KeyboardInterrupt, as Ctrl-C does. A worker ignores the
        later ones (its run is ending: a second one would cut its cleanup short); the controller hands SIGTERM
        back to its previous handler, so a second SIGTERM ends it as before."""
        if self.role != "worker" and signum == signal.SIGTERM:
            signal.signal(signum, self._previous.pop(signum))
        if self.flag.trip():
            raise KeyboardInterrupt(signal.Signals(signum).name)

    def _defer(self) -> None:
        """The tests have run: a signal now would cut the session's end (reports, xdist's teardown) short with a
        traceback. So the first one is noted (the run then exits 2, :meth:`pytest_unconfigure`) and the end
        goes on; a second acts as it did before."""
        if threading.current_thread() is not threading.main_thread():
            return
        for s in (signal.SIGINT, signal.SIGTERM):
            self._previous.setdefault(s, signal.getsignal(s))
            signal.signal(s, self._on_late_signal)

    def _on_late_signal(self, signum: int, frame: FrameType | None) -> None:
        signal.signal(signum, self._previous.get(signum, signal.SIG_DFL))
        if self.flag.trip():
            self.late = signal.Signals(signum).name

    def _restore(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for s, handler in self._previous.items():
                signal.signal(s, handler)
        self._previous.clear()

    # -- hooks ------------------------------------------------------------------------------------
    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.role == "controller":
            self._install((signal.SIGTERM,))
        elif self.role == "worker" and self._install((signal.SIGINT, signal.SIGTERM)) and self.flag.path:
            self.watcher = Watcher(self.flag)
            self.watcher.start()

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.role == "single" and any(map(uses_store, session.items)):
            self.active = self._install((signal.SIGTERM,))  # a run without kvaudit tests keeps its signals

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        self.session = session
        result = yield  # an interrupt here raises through pytest's own Ctrl-C path
        if self.active:
            self._defer()
        return result

    @pytest.hookimpl
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo[BaseException]) -> None:
        self.stop(f"{self.name}: {excinfo.typename} {excinfo.value}".strip())

    def stop(self, why: str) -> None:
        """This process is interrupted: tell the run's other processes (once), and act on no later signal."""
        self.flag.trip()
        if not self.flag.requested():
            self.flag.request(why)

    @pytest.hookimpl(wrapper=True, trylast=True)  # inside pytest's own warnings wrapper, which sets the filters
    def pytest_sessionfinish(self, session: pytest.Session) -> Generator[None, None, None]:
        if session.exitstatus != pytest.ExitCode.INTERRUPTED:
            return (yield)
        self.stop(f"{self.name}: interrupted")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=SYRUPY_INCOMPLETE, category=UserWarning)
            return (yield)

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.watcher is not None:
            self.watcher.close()
        self._restore()
        if self.late is not None and self.session is not None:
            # read by pytest after this hook: the run was interrupted, although every test had run
            self.session.exitstatus = pytest.ExitCode.INTERRUPTED
            tr = config.pluginmanager.get_plugin("terminalreporter")
            if tr is not None and self.role != "worker":
                tr.write_line(f"kvaudit: {self.late} while the run was ending: it ended first; exit status 2",
                              yellow=True)


def register(config: pytest.Config, folder: Path | None) -> Interrupts:
    """The process's :class:`Interrupts`, by its place in the run (xdist controller, worker or neither)."""
    wi = getattr(config, "workerinput", None)
    if wi is not None:
        role, name = "worker", str(wi.get("workerid", "worker"))
    elif getattr(config.option, "numprocesses", None) and config.pluginmanager.hasplugin("xdist"):
        role, name = "controller", "controller"
    else:
        role, name, folder = "single", "pytest", None
    plugin = Interrupts(role, folder, name)
    config.pluginmanager.register(plugin, "kvaudit-interrupts")
    return plugin
