"""Interrupting a run: whichever process a signal reaches (the whole process group as Ctrl-C does, the xdist
controller alone as a CI cancel or ``kill -INT <pid>`` does, one worker alone), with SIGINT or SIGTERM, the
run ends within seconds with pytest's interrupted summary, exit status 2, no traceback, no process left
and no half-written file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pytest_kvaudit.workers.exports import collect_exports
from pytest_kvaudit.workers.queue import WorkQueue
from pytest_kvaudit.workers.stop import StopFlag, Stopped, Watcher

CLAIM = """
def test_counts(kvaudit_records):
    assert kvaudit_records
"""


def children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def interrupted_run(pytester: pytest.Pytester, target: str, sig: signal.Signals) -> tuple[int, str, float, list[int]]:
    """Run ``-n 2`` on 60 embedded items, signal ``target`` once computation shows; return (exit status, output,
    seconds from the signal to the last process gone, processes still alive then)."""
    pytester.makepyfile(test_own_claim=CLAIM)
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "--kvaudit-model=embedded", "--kvaudit-n=60", "-p",
           "no:cacheprovider", "-W", "error", f"--kvaudit-report={pytester.path / 'r.json'}"]
    # a session of its own: a signal to the "group" is to this run's processes, not to this test's
    proc = subprocess.Popen(cmd, cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    assert proc.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 180
    while not any("kvaudit: items done" in line for line in lines) and time.monotonic() < deadline:
        assert proc.poll() is None, "".join(lines)
        time.sleep(0.05)
    workers = children(proc.pid)
    assert len(workers) == 2, "".join(lines)
    start = time.monotonic()
    {"group": lambda: os.killpg(proc.pid, sig), "controller": lambda: os.kill(proc.pid, sig),
     "worker": lambda: os.kill(workers[0], sig)}[target]()
    try:
        rc = proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = -999
    while any(map(alive, workers)) and time.monotonic() - start < 30:
        time.sleep(0.05)
    elapsed = time.monotonic() - start
    left = [p for p in [proc.pid, *workers] if alive(p)]
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    reader.join(timeout=10)
    proc.stdout.close()
    return rc, "".join(lines), elapsed, left


@pytest.mark.parametrize(("target", "sig"), [("controller", signal.SIGINT), ("controller", signal.SIGTERM),
                                             ("group", signal.SIGINT), ("worker", signal.SIGINT)])
def test_an_interrupt_ends_the_xdist_run_soon_and_cleanly(pytester: pytest.Pytester, target: str,
                                                          sig: signal.Signals) -> None:
    rc, out, elapsed, left = interrupted_run(pytester, target, sig)
    assert rc == pytest.ExitCode.INTERRUPTED, out
    assert "!!! KeyboardInterrupt" in out and "Traceback" not in out, out
    assert "kvaudit: interrupted: no claim judged on the whole run, no report written" in out, out
    assert not left and elapsed < 15, (elapsed, left, out)
    assert not (pytester.path / "r.json").exists() and not list(pytester.path.rglob("*.tmp")), out


# -- the stop flag and what honours it, in one process ----------------------------------------------
def test_the_queue_and_the_shard_wait_stop_once_the_run_is_asked_to(tmp_path: Path) -> None:
    flag = StopFlag(tmp_path)
    queue = WorkQueue(tmp_path, 0, 10, stop=flag)
    assert queue.take(0) == 0
    flag.request("gw1: KeyboardInterrupt")
    with pytest.raises(Stopped, match="gw1: KeyboardInterrupt"):
        queue.take(0)
    assert queue.take(0) == 1  # tripped once: the process is already unwinding, nothing raises twice
    other = StopFlag(tmp_path)
    with pytest.raises(Stopped):
        collect_exports(tmp_path, 2, poll=0.01, stop=other)
    with pytest.raises(Stopped):
        WorkQueue(tmp_path, 1, 10, stop=StopFlag(tmp_path)).prefix(5)


def test_a_stop_flag_without_a_folder_never_stops(tmp_path: Path) -> None:
    flag = StopFlag(None)
    flag.request("nothing to write to")
    flag.check()
    assert not flag.requested() and flag.trip() and not flag.trip()


def test_the_watcher_interrupts_the_main_thread(tmp_path: Path) -> None:
    flag = StopFlag(tmp_path)
    watcher = Watcher(flag, poll=0.01)
    got: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda s, f: got.append(s))
    try:
        watcher.start()
        flag.request("controller: KeyboardInterrupt")
        deadline = time.monotonic() + 5
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        watcher.close()
        signal.signal(signal.SIGINT, previous)
    assert got == [signal.SIGINT]


def test_a_signal_while_the_run_ends_lets_it_end_and_exits_2(pytester: pytest.Pytester) -> None:
    """Every test ran; a Ctrl-C during the session's end (reports, xdist's teardown) would otherwise be a
    traceback out of pytest's last hooks."""
    pytester.makeconftest("""
        import os, signal
        import pytest

        @pytest.hookimpl(tryfirst=True)
        def pytest_sessionfinish(session):
            if not hasattr(session.config, "workerinput"):
                os.kill(os.getpid(), signal.SIGINT)
    """)
    pytester.makepyfile(test_plain="def test_one(): pass")
    res = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.INTERRUPTED, res.stdout.str()
    res.stdout.fnmatch_lines(["*1 passed*", "kvaudit: SIGINT while the run was ending: it ended first; exit status 2"])
    assert "Traceback" not in res.stdout.str() + res.stderr.str()

