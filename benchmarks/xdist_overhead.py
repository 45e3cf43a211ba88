"""What the installed plugin costs a project's unrelated ``pytest -n 2`` run: a trivial test file, timed
with the plugin and with ``-p no:kvaudit``, alternating, in one run; the ratio of the medians.

    python benchmarks/xdist_overhead.py --repeat 7      # about 30 seconds on 2 cores

Target: within 1.2x. A run that collects no kvaudit test imports no torch and computes nothing on the
controller or any worker (``tests/plugin/test_users_path.py`` asserts the import side).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def timed(cwd: Path, *extra: str) -> float:
    cmd = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-p", "no:cacheprovider", *extra]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"pytest failed ({res.returncode}):\n{res.stdout[-2000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        (cwd / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        timed(cwd)  # warm the file cache for both
        with_plugin, without = [], []
        for _ in range(a.repeat):
            with_plugin.append(timed(cwd))
            without.append(timed(cwd, "-p", "no:kvaudit"))
    m1, m0 = statistics.median(with_plugin), statistics.median(without)
    print(f"pytest -n 2, one trivial test, {a.repeat} runs each (alternating)")
    print(f"  with kvaudit installed   median {m1:.2f}s  (min {min(with_plugin):.2f}s)")
    print(f"  -p no:kvaudit            median {m0:.2f}s  (min {min(without):.2f}s)")
    ratio = m1 / m0
    print(f"  ratio {ratio:.2f}x (target <= 1.2x): {'ok' if ratio <= 1.2 else 'MISSED'}")


if __name__ == "__main__":
    main()
