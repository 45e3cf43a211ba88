"""The progress line: items done per precision, tokens per second and, once the model loads and kernel
set-up are a small part of the time spent, the time left."""

from __future__ import annotations

import json
from pathlib import Path

from pytest_kvaudit.progress import Tally, worker_progress


def test_no_time_left_is_guessed_from_the_first_items() -> None:
    t = Tally(["bf16", "fp32"], 200, {"bf16": 1}, tokens=400, seconds=4.0)  # the first cell carried the load
    assert t.line() == "kvaudit: items done bf16 1/200, fp32 0/200; 100 tokens/s; time left after a few more items"


def test_time_left_from_the_share_done() -> None:
    t = Tally(["bf16", "fp32"], 200, {"bf16": 200, "fp32": 100}, tokens=90_000, seconds=90.0)
    assert t.line() == "kvaudit: items done bf16 200/200, fp32 100/200; 1,000 tokens/s; ~30s left"
    done = Tally(["bf16"], 2, {"bf16": 2}, tokens=10, seconds=1.0)
    assert done.line().endswith("~0s left")


def test_totals_add_the_workers_up() -> None:
    a = Tally(["bf16"], 3, {"bf16": 2}, tokens=10, seconds=2.0)
    b = Tally(["bf16"], 2, {"bf16": 1}, tokens=6, seconds=3.0)
    t = Tally.total([a, b])
    assert t.items == 5 and t.done == {"bf16": 3} and t.tokens == 16


def test_a_workers_last_tally_is_written_however_soon_it_comes(tmp_path: Path) -> None:
    # a worker taking items from a shared queue may stop short of its nominal part: its end is the word
    write = worker_progress(tmp_path, 0)
    t = Tally(["bf16"], 4, {"bf16": 1}, tokens=10, seconds=1.0)
    write(t)
    t.done["bf16"] = 3
    write(t)  # throttled: within half a second of the last
    assert json.loads((tmp_path / "progress-0.json").read_text())["done"] == {"bf16": 1}
    t.finished = True
    write(t)
    assert json.loads((tmp_path / "progress-0.json").read_text())["done"] == {"bf16": 3}
