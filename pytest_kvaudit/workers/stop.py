"""A run's stop flag: one interrupted process of an xdist run tells the others to stop.

A CI cancel or ``kill -INT <pid>`` reaches the xdist controller alone (or one worker alone), not the whole
process group; the workers would compute their shard on (hours on a GPU) until xdist kills them, and a
kill mid-write leaves temporary files behind. So whichever process is interrupted writes ``stop`` into the
run's shard folder, every worker watches for it (a thread that interrupts its main thread, even mid-item)
and the queue's waits check it, and each process ends through its own Ctrl-C path: pytest's interrupted
summary, atomic writes cleaned up.

The flag is tripped once per process: the first interrupt (a signal, the watcher, a queue check) raises
:class:`Stopped` or ``KeyboardInterrupt``; later ones are ignored while the process unwinds, so a second
interrupt cannot cut its cleanup short. Plain files and threads, no pytest.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

STOP_FILE = "stop"


class Stopped(KeyboardInterrupt):
    """Another process of the run was interrupted: this one stops too, as if it had been."""


class StopFlag:
    """One process's view of its run's stop: ``folder`` is the run's shard folder (None: a single process)."""

    def __init__(self, folder: Path | None) -> None:
        self.path = folder / STOP_FILE if folder is not None else None
        self.tripped = False
        self._lock = threading.Lock()

    def trip(self) -> bool:
        """Mark this process interrupted; True the first time only (the one interrupt that is acted on)."""
        with self._lock:
            first, self.tripped = not self.tripped, True
            return first

    def requested(self) -> bool:
        """Whether some process of the run asked every process to stop."""
        return self.path is not None and self.path.exists()

    def request(self, why: str) -> None:
        """Ask every process of the run to stop (idempotent; a folder already removed means the run ended)."""
        if self.path is None:
            return
        try:
            self.path.write_text(why)
        except OSError:
            pass

    def check(self) -> None:
        """In a wait or between items: raise :class:`Stopped` when the run was asked to stop."""
        if self.requested() and self.trip():
            raise Stopped(f"kvaudit: stopped: {self.reason()}")

    def reason(self) -> str:
        try:
            return self.path.read_text().strip() if self.path is not None else ""
        except OSError:
            return "the run was interrupted"


class Watcher:
    """A daemon thread that turns a stop request into a SIGINT for this process, so that the main thread stops
    mid-item (the signal handler, installed by the caller, decides through :meth:`StopFlag.trip`)."""

    def __init__(self, flag: StopFlag, poll: float = 0.1) -> None:
        self.flag, self.poll = flag, poll
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kvaudit-stop-watcher", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.done.set()

    def _run(self) -> None:
        while not self.done.wait(self.poll):
            if self.flag.tripped:
                return  # interrupted already: nothing left to tell the main thread
            if self.flag.requested():
                os.kill(os.getpid(), signal.SIGINT)
                return
