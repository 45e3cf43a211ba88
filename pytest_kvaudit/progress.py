"""Progress while stores compute: items done of total per precision, tokens per second, time left.

A store reports a :class:`Tally` as it goes. In one process the callback prints it at once; on an xdist
worker it is written to the shard folder (atomically, at most twice a second) and the controller's
:class:`WorkerProgress` thread adds the workers' tallies up and prints them. Printing goes through pytest's
terminal reporter: one line rewritten in place on a terminal, a line every tenth of the work in a log,
nothing under ``-q``.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.compute.progress import Progress, Tally


class Printer:
    """Prints tallies through the terminal reporter, throttled; ``None`` from :func:`printer` when quiet."""

    def __init__(self, config: pytest.Config) -> None:
        self.tr: Any = config.pluginmanager.get_plugin("terminalreporter")
        self.cap: Any = config.pluginmanager.get_plugin("capturemanager")
        self.tty = bool(getattr(self.tr, "isatty", False))
        self.shown, self.decile, self.finished = 0.0, -1, False

    def __call__(self, t: Tally) -> None:
        done = t.fraction >= 1.0
        if not t.done and t.items:
            return  # a worker announcing its size: nothing to show yet
        decile = int(t.fraction * 10)
        now = time.monotonic()
        if self.finished or (not done and ((self.tty and now - self.shown < 0.5)
                                           or (not self.tty and decile == self.decile))):
            return
        self.shown, self.decile, self.finished = now, decile, done
        with self.cap.global_and_fixture_disabled() if self.cap is not None else nullcontext():
            if self.tty:
                self.tr.rewrite(t.line(), erase=True)
                if done:
                    self.tr.write_line("")
            else:
                if getattr(getattr(self.tr, "_tw", None), "width_of_current_line", 0):
                    self.tr.write_line("")  # after xdist's progress dots, not glued to them
                self.tr.write_line(t.line())


def printer(config: pytest.Config) -> Printer | None:
    if config.pluginmanager.get_plugin("terminalreporter") is None or config.get_verbosity() < 0:
        return None
    return Printer(config)


def worker_progress(folder: Path, index: int) -> Progress:
    """On an xdist worker: the tally to ``progress-<index>.json``, at most twice a second."""
    last = [0.0]

    def write(t: Tally) -> None:
        now = time.monotonic()
        if not t.finished and t.fraction < 1.0 and now - last[0] < 0.5:
            return
        last[0] = now
        atomic_write_text(folder / f"progress-{index}.json", json.dumps(asdict(t)))

    return write


class WorkerProgress:
    """On the xdist controller: a thread that adds up the workers' progress files and prints them."""

    def __init__(self, folder: Path, show: Printer) -> None:
        self.folder, self.show = folder, show
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="kvaudit-progress", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=2)
        self.poll()  # the last tally, whatever the thread's timing

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self.poll()

    def poll(self) -> None:
        tallies = []
        for p in sorted(self.folder.glob("progress-*.json")):
            try:
                tallies.append(Tally(**json.loads(p.read_text())))
            except (OSError, ValueError, TypeError):
                continue  # a worker is replacing it right now
        if tallies:
            self.show(Tally.total(tallies))
