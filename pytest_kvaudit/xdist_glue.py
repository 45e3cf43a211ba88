"""pytest-xdist glue: shard items over workers, judge every claim on the whole.

Every worker computes a part of the items (taken one at a time from a queue in a folder the controller
handed out through ``workerinput``, :mod:`.workqueue`, so that a worker with costly divergent items does
not hold the other up) and writes it, atomically, to that folder. A claim test, on whichever worker it
lands, waits for every part and judges the merged records, so a claim over 200 items is one verdict
whatever ``-n``. A worker that dies leaves a ``.dead`` marker (written by the controller in
``pytest_testnodedown``): the items it computed are reported missing and no claim that needed them can
pass.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from .files import atomic_write_text
from .progress import ShardProgress, printer

SHARD_DIR = "kvaudit_shard_dir"


class XdistController:
    """Registered on the controller only when xdist runs workers."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="kvaudit-shards-"))
        self.progress: ShardProgress | None = None
        self.workers = 0  # xdist's worker count, known once the first node is configured

    @pytest.hookimpl
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        show = printer(session.config)
        if show is not None:  # prints only once workers write progress, i.e. when kvaudit tests run
            self.progress = ShardProgress(self.dir, show)
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
        if error is None:
            return
        wid = str(node.workerinput.get("workerid", ""))
        if wid.startswith("gw"):
            (self.dir / f"shard-{wid[2:]}.dead").write_text(str(error)[:2000])

    @pytest.hookimpl
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def worker_shard(config: pytest.Config) -> tuple[int, int, Path] | None:
    """(index, count, folder) on an xdist worker that takes part in sharding, else None."""
    wi = getattr(config, "workerinput", None)
    if not wi or SHARD_DIR not in wi:
        return None
    count = int(wi["workercount"])
    index = int(str(wi["workerid"]).removeprefix("gw"))
    # a replacement for a crashed worker has an index past the count: it reads, it computes nothing
    return (index if index < count else -1, count, Path(wi[SHARD_DIR]))


def write_shard(folder: Path, index: int, export: dict[str, Any]) -> None:
    atomic_write_text(folder / f"shard-{index}.json", json.dumps(export, default=list))


def write_shard_error(folder: Path, index: int, message: str) -> None:
    atomic_write_text(folder / f"shard-{index}.error", message)


def collect_shards(folder: Path, count: int, poll: float = 0.2, timeout: float | None = None) -> dict[str, Any]:
    """Wait for every shard; returns {"exports": [...], "dead": [index...], "error": message or None}."""
    start = time.monotonic()
    while True:
        done: dict[int, Path | None] = {}
        dead: list[int] = []
        error: str | None = None
        for i in range(count):
            if (folder / f"shard-{i}.json").exists():
                done[i] = folder / f"shard-{i}.json"
            elif (folder / f"shard-{i}.error").exists():
                error = (folder / f"shard-{i}.error").read_text()
                done[i] = None
            elif (folder / f"shard-{i}.dead").exists():
                dead.append(i)
        if len(done) + len(dead) == count:
            break
        if timeout is not None and time.monotonic() - start > timeout:
            dead += [i for i in range(count) if i not in done and i not in dead]
            break
        time.sleep(poll)
    exports = [json.loads(p.read_text()) for i, p in sorted(done.items()) if p is not None]
    return {"exports": exports, "dead": sorted(dead), "error": error}
