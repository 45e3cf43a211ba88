"""One run over many processes: the xdist workers' shards and the runners' partials (``--kvaudit-shard``,
``--kvaudit-merge``), written and merged into the store of one run over all items. No pytest here."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.workers.partials import item_set_info, write

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.workers.stop import StopFlag


# -- the xdist workers' shards: one file each in the folder the controller handed out ------------------
def write_export(folder: Path, index: int, data: dict[str, Any]) -> None:
    atomic_write_text(folder / f"worker-{index}.json", json.dumps(data, default=list))


def write_export_error(folder: Path, index: int, message: str) -> None:
    atomic_write_text(folder / f"worker-{index}.error", message)


def collect_exports(folder: Path, count: int, poll: float = 0.2, timeout: float | None = None,
                   stop: StopFlag | None = None) -> dict[str, Any]:
    """Wait for every shard (or for the run's stop flag); returns {"exports": [...], "dead": [index...],
    "error": message or None}."""
    start = time.monotonic()
    while True:
        if stop is not None:
            stop.check()
        done: dict[int, Path | None] = {}
        dead: list[int] = []
        error: str | None = None
        for i in range(count):
            if (folder / f"worker-{i}.json").exists():
                done[i] = folder / f"worker-{i}.json"
            elif (folder / f"worker-{i}.error").exists():
                error = (folder / f"worker-{i}.error").read_text()
                done[i] = None
            elif (folder / f"worker-{i}.dead").exists():
                dead.append(i)
        if len(done) + len(dead) == count:
            break
        if timeout is not None and time.monotonic() - start > timeout:
            dead += [i for i in range(count) if i not in done and i not in dead]
            break
        time.sleep(poll)
    exports = [json.loads(p.read_text()) for i, p in sorted(done.items()) if p is not None]
    return {"exports": exports, "dead": sorted(dead), "error": error}


# -- a runner's shard ------------------------------------------------------------------
def export(store: Store, set_name: str) -> dict[str, Any]:
    """A store's export with what a merge compares across runners: the item set and the options that decide
    the work (``plan``, as :mod:`.partials` checks it); the run's priced plan travels as ``run_plan``."""
    return {**store.export(), "item_set": item_set_info(store.item_set, set_name), "plan": store.cfg.work_identity(),
            "run_plan": store.plan}


def write_partial(folder: Path, shard: tuple[int, int], exports: list[dict[str, Any]]) -> Path:
    try:
        return write(folder, *shard, exports)
    except OSError as exc:
        raise KvauditError(f"--kvaudit-partials={folder}: cannot write the partial ({exc})") from None


def finish_shard(shard: tuple[int, int], folder: Path, written: Path | None, error: str | None,
                 shard_dir: Path | None, workers: int) -> tuple[str, Path | None]:
    """A runner's shard at the end of its run: (the summary line, starting with "FAILED" when nothing was
    written; the partial written). Under xdist the partial is written here from the workers' shards."""
    i, n = shard
    if shard_dir is not None and written is None:
        got = collect_exports(shard_dir, workers, timeout=0)
        if got["error"] or got["dead"] or len(got["exports"]) != workers:
            why = got["error"] or (f"worker(s) {', '.join(f'gw{w}' for w in got['dead'])} computed nothing or died"
                                   if len(got["exports"]) else "no kvaudit test ran")
            return f"FAILED: shard {i}/{n} not recorded: {why}", None
        try:
            written = write_partial(folder, shard, got["exports"])
        except KvauditError as exc:
            return f"FAILED: shard {i}/{n} not recorded: {exc}", None
    if written is None:
        return f"FAILED: shard {i}/{n} not recorded: {error or 'no kvaudit test ran'}", None
    return f"shard {i}/{n} recorded to {written}: judge all {n} with --kvaudit-merge={folder}", written
