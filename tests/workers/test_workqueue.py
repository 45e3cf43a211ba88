"""The xdist work queue: each item handed out once, budgets counted over every worker's published
items, and a later precision's wait for a prefix ends when the worker that had it is known dead."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from pytest_kvaudit.workers.queue import LostItem, WorkQueue


def test_each_item_is_taken_once_in_item_order(tmp_path: Path) -> None:
    a, b = WorkQueue(tmp_path, 0, 5), WorkQueue(tmp_path, 1, 5)
    got = [a.take(0), b.take(0), b.take(0), a.take(0), a.take(0), b.take(0), a.take(0)]
    assert got == [0, 1, 2, 3, 4, None, None]
    assert a.take(1) == 0 and b.take(1) == 1  # each precision has its own queue


def test_budgets_count_what_every_worker_published_before_the_unit(tmp_path: Path) -> None:
    a, b = WorkQueue(tmp_path, 0, 6), WorkQueue(tmp_path, 1, 6)
    a.done(0, 0, True, (1, 2))
    b.done(0, 1, False, (3,))
    b.done(0, 3, True, None)
    # unit 2 is in flight, but with one unit granted before it a budget of 3 has room whatever it turns out
    assert a.grant(0, 3, (3, 1)) == (True, False)
    assert a.prefix(1) == (3,) and a.prefix(3) is None


def test_a_grant_waits_for_a_unit_in_flight_that_decides_it(tmp_path: Path) -> None:
    # a single run gives the budget of 1 to unit 0 when it is a transplant unit, else to unit 1: unit 1's
    # worker must wait for unit 0, however long it takes, never guess
    for flagged in (True, False):
        folder = tmp_path / str(flagged)
        folder.mkdir()
        a, b = WorkQueue(folder, 0, 2, poll=0.01), WorkQueue(folder, 1, 2, poll=0.01)
        later = threading.Timer(0.3, b.done, (0, 0, flagged, (5,)))
        later.start()
        t0 = time.monotonic()
        assert a.grant(0, 1, (1,)) == (not flagged,)
        assert time.monotonic() - t0 >= 0.25
        later.join()


def test_a_later_precision_counts_every_unit_of_the_first(tmp_path: Path) -> None:
    a, b = WorkQueue(tmp_path, 0, 2), WorkQueue(tmp_path, 1, 2)
    a.done(0, 0, True, (1,))
    b.done(0, 1, True, (2,))
    assert a.grant(1, 0, (2, 3)) == (False, True)


def test_a_half_written_line_is_read_once_complete(tmp_path: Path) -> None:
    a = WorkQueue(tmp_path, 0, 2, poll=0.01)
    (tmp_path / "done-1.jsonl").write_text('{"phase": 0, "index": 1, "flagged": true, "pre')
    a.done(0, 0, False, (1,))

    def finish() -> None:
        with open(tmp_path / "done-1.jsonl", "a") as f:
            f.write('fix": [7]}\n')

    waiting = threading.Timer(0.2, finish)
    waiting.start()
    assert a.grant(1, 0, (1,)) == (False,)  # read only once the line is whole
    waiting.join()
    assert a.prefix(1) == (7,)


def test_a_grant_stops_waiting_once_a_worker_died(tmp_path: Path) -> None:
    a = WorkQueue(tmp_path, 0, 2, poll=0.01)
    (tmp_path / "worker-1.dead").write_text("node down")
    assert a.grant(0, 1, (1,)) == (True,)  # the run is incomplete anyway: its items are missing


def test_waiting_for_a_prefix_ends_when_a_worker_died(tmp_path: Path) -> None:
    a = WorkQueue(tmp_path, 0, 2, poll=0.01)
    (tmp_path / "worker-1.dead").write_text("node down")
    with pytest.raises(LostItem, match="worker-1.dead"):
        a.prefix(1)


def test_nominal_shares_add_up() -> None:
    assert [WorkQueue.nominal(7, w, 3) for w in range(3)] == [3, 2, 2]
