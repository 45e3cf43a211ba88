"""Work stealing for xdist workers: items handed out one at a time to whichever worker asks first.

Round-robin parts are uneven: a divergent item carries transplants (and, on the first few, the layer
sweep), so it costs several times a plain one, and which items diverge is known only once computed. Here
the workers of one run take the next item of the current precision from a counter under a file lock, so
none waits for another but for the item in hand.

What a single process decides from the items before the current one is decided the same way here, from
what every worker has published (one append-only log per worker, a line per computed item):

- the fixed-prefix 2x2 of a later precision reads the first precision's prefix of the same item, which
  another worker may have computed: :meth:`WorkQueue.prefix` waits for it;
- the donor and sweep budgets (``donor_max_units``, ``sweep_units``) go to the first divergent units in
  (precision, item) order. :meth:`WorkQueue.grant` counts the transplant units published before the one in
  hand and, while a unit before it is still in flight elsewhere and could change the answer, waits for it
  (only near a budget's edge: at most one cell per other worker). So every worker spends the budgets
  exactly as a single process does: the same records, the same forward tokens, whatever ``-n``.

Plain files, no pytest, no torch.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pytest_kvaudit.workers.stop import StopFlag


from pytest_kvaudit.core.compute.grants import LostItem, within


class WorkQueue:
    """One run's queue over ``size`` items, shared by the workers through ``folder``: a
    :class:`~pytest_kvaudit.core.compute.grants.WorkSource`."""

    def __init__(self, folder: Path, worker: int, size: int, poll: float = 0.05, timeout: float = 3600.0,
                 stop: StopFlag | None = None) -> None:
        self.folder, self.worker, self.size = folder, worker, size
        self.poll, self.timeout = poll, timeout
        self.stop = stop  # the run's stop flag: checked before each item and in every wait
        self.log = folder / f"done-{worker}.jsonl"
        # what this worker knows: (phase, index) -> (flagged, prefix); re-read from the logs when it must
        self.known: dict[tuple[int, int], tuple[bool, list[int] | None]] = {}
        self._offsets: dict[Path, int] = {}

    def take(self, phase: int) -> int | None:
        """The next untaken item index of ``phase`` (a precision), or None when every one is taken."""
        import fcntl  # POSIX: xdist work sharing needs it; a plain run never imports it

        self._check_stop()
        counter = self.folder / f"queue-{phase}"
        with open(self.folder / "queue.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                n = int(counter.read_text()) if counter.exists() else 0
                if n >= self.size:
                    return None
                counter.write_text(str(n + 1))
                return n
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def done(self, phase: int, index: int, flagged: bool, prefix: tuple[int, ...] | None = None) -> None:
        """Publish a computed item: whether it is a transplant unit, and (first precision) its prefix ids."""
        ids = None if prefix is None else list(prefix)
        self.known[(phase, index)] = (flagged, ids)
        entry = {"phase": phase, "index": index, "flagged": flagged, "prefix": ids}
        with open(self.log, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()

    def _read(self) -> None:
        """Take in what the other workers published since the last read (whole lines only)."""
        for p in self.folder.glob("done-*.jsonl"):
            if p == self.log:
                continue
            with open(p) as f:
                f.seek(self._offsets.get(p, 0))
                chunk = f.read()
            end = chunk.rfind("\n") + 1
            for line in chunk[:end].splitlines():
                e = json.loads(line)
                self.known[(int(e["phase"]), int(e["index"]))] = (bool(e["flagged"]), e.get("prefix"))
            self._offsets[p] = self._offsets.get(p, 0) + len(chunk[:end].encode())

    def grant(self, phase: int, index: int, budgets: tuple[int, ...]) -> tuple[bool, ...]:
        """For a divergent unit (phase, index): whether each budget still has room for it, in a single run's
        order, as soon as the units in flight before it cannot change the answer. Once a worker is known dead
        or failed the run is incomplete anyway (its items are missing) and what is known decides."""
        start = time.monotonic()
        while True:
            self._read()
            before = [(ph, i) for ph in range(phase + 1) for i in range(index if ph == phase else self.size)]
            flagged = sum(1 for u in before if self.known.get(u, (False, None))[0])
            unknown = sum(1 for u in before if u not in self.known)
            if all(flagged >= b or flagged + unknown < b for b in budgets) or self._failed(start):
                return within(flagged, budgets)
            self._check_stop()
            time.sleep(self.poll)

    def _check_stop(self) -> None:
        """Another process was interrupted: stop here rather than wait for (or take) work nobody will judge."""
        if self.stop is not None:
            self.stop.check()

    def _failed(self, start: float) -> list[str]:
        failed = [p.name for p in self.folder.glob("worker-*") if p.suffix in (".error", ".dead")]
        return failed or (["timed out"] if time.monotonic() - start > self.timeout else [])

    def prefix(self, index: int, phase: int = 0) -> tuple[int, ...] | None:
        """The first precision's prefix of item ``index`` (None when it was ineligible), waiting for it; raises
        :class:`LostItem` once a worker is known dead or failed (the item is then missing, never half there)."""
        start = time.monotonic()
        while (phase, index) not in self.known:
            self._read()
            if (phase, index) in self.known:
                break
            if failed := self._failed(start):
                raise LostItem(f"item {index}: {', '.join(failed)}")
            self._check_stop()
            time.sleep(self.poll)
        p = self.known[(phase, index)][1]
        return None if p is None else tuple(p)

    @staticmethod
    def nominal(size: int, worker: int, workers: int) -> int:
        """A worker's round-robin part of ``size``: what its progress counts toward (the totals add up)."""
        return size // workers + (worker < size % workers)

