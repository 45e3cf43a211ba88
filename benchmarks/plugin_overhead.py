"""What the installed plugin costs a project's unrelated pytest run (issue 44, part 5): one trivial test in a temp
dir, run with kvaudit installed and with ``-p no:kvaudit``, in pairs whose order alternates, for ``-n 0`` and
``-n 2``; the medians of the paired differences, and their spread.

    python benchmarks/plugin_overhead.py --pairs 30 --out benchmarks/results/plugin-overhead/results.json

Two figures a run: its wall time (what the user waits) and the CPU time of all its processes (the controller and,
under ``-n 2``, both workers: reaped children count), which a loaded machine disturbs less; the CPU difference is
divided by the process count for the cost a process. Target: within 20 ms a process of ``-p no:kvaudit``, on both
figures' medians. Also: the plugin's own import after pytest's (``python -X importtime``, median of repeats), and
the modules it loads. ``--source DIR`` measures another checkout's package instead (``git worktree add DIR main``:
the figures before a change) through ``PYTHONPATH``. Bytecode caching stays on, as in a user's venv. Not a test:
timings never are (``tests/plugin/test_lean.py`` holds the import property itself).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TARGET_MS = 20.0


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else ""
    import pytest
    import xdist

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "pytest": pytest.__version__,
            "xdist": xdist.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def env_for(source: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # a user's run names no kvaudit option
    if source is not None:
        env["PYTHONPATH"] = str(source)
    return env


def timed(cwd: Path, env: dict[str, str], workers: str, plugin: bool) -> tuple[float, float]:
    """(wall s, CPU s of the run's processes) of one pytest run."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", workers, "test_trivial.py"]
    if not plugin:
        cmd += ["-p", "no:kvaudit"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0 or "1 passed" not in res.stdout:
        raise SystemExit(f"pytest failed ({res.returncode}): {' '.join(cmd)}\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(xs: list[float]) -> dict[str, float]:
    """Median, quartiles and range, in ms."""
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return {"median": round(1000 * statistics.median(xs), 1), "q1": round(1000 * q[0], 1),
            "q3": round(1000 * q[2], 1), "min": round(1000 * min(xs), 1), "max": round(1000 * max(xs), 1)}


def summary(workers: str, runs: dict[bool, list[tuple[float, float]]]) -> dict[str, Any]:
    procs = 1 if workers == "0" else 1 + int(workers)
    wall_d = [a[0] - b[0] for a, b in zip(runs[True], runs[False])]
    cpu_d = [(a[1] - b[1]) / procs for a, b in zip(runs[True], runs[False])]
    out = {"workers": workers, "processes": procs, "pairs": len(wall_d),
           "wall_with_ms": spread([w for w, _ in runs[True]]), "wall_without_ms": spread([w for w, _ in runs[False]]),
           "wall_difference_ms": spread(wall_d), "cpu_difference_per_process_ms": spread(cpu_d)}
    out["ok"] = (out["wall_difference_ms"]["median"] <= TARGET_MS
                 and out["cpu_difference_per_process_ms"]["median"] <= TARGET_MS)
    return out


def import_cost(env: dict[str, str], repeats: int) -> dict[str, Any]:
    """The plugin's cumulative import time after pytest's (``-X importtime``), and the kvaudit modules it loads."""
    code = "import pytest, xdist.plugin\nimport pytest_kvaudit.plugin"
    cums, modules = [], []
    for _ in range(repeats):
        res = subprocess.run([sys.executable, "-X", "importtime", "-c", code], env=env, capture_output=True, text=True,
                             check=True, cwd=tempfile.gettempdir())  # not a checkout: "" on sys.path finds none
        rows = [line.split("|") for line in res.stderr.splitlines() if line.startswith("import time:")]
        # "import time: self | cumulative | <two spaces a nesting level>name"; the package and its plugin module
        # are imported at the top level, everything of kvaudit's else beneath them
        top = [(int(r[1]), r[2][1:]) for r in rows[1:] if not r[2][1:].startswith(" ")]
        cums.append(sum(c for c, name in top if name.startswith("pytest_kvaudit")) / 1000)
        modules = sorted(r[2].strip() for r in rows[1:] if r[2].strip().startswith("pytest_kvaudit"))
    return {"plugin_import_ms": round(statistics.median(cums), 1), "repeats": repeats, "modules": modules}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=30, help="0: the plugin's import time alone")
    ap.add_argument("--workers", default="0,2", help="comma list of -n values")
    ap.add_argument("--source", type=Path, default=None, help="measure this checkout's package (PYTHONPATH)")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    a = ap.parse_args()
    env = env_for(a.source.resolve() if a.source else None)
    res: dict[str, Any] = {"command": " ".join(["python", "benchmarks/plugin_overhead.py", *sys.argv[1:]]),
                           "machine": machine(), "source": str(a.source or REPO),
                           "load_average_start": round(os.getloadavg()[0], 2)}
    res["import"] = import_cost(env, 11)
    if a.pairs == 0:  # the import alone
        res["runs"] = []
        report(res, a.out)
        return
    modes = [w.strip() for w in a.workers.split(",")]
    runs: dict[str, dict[bool, list[tuple[float, float]]]] = {w: {True: [], False: []} for w in modes}
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        (cwd / "pytest.ini").write_text("[pytest]\n")  # the temp dir is the rootdir: no project's config
        (cwd / "test_trivial.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
        for w in modes:  # warm the file cache and the bytecode, both arms
            timed(cwd, env, w, True)
            timed(cwd, env, w, False)
        for i in range(a.pairs):  # the modes interleaved too, so that a stopped run still has both
            for w in modes:
                for plugin in ((True, False) if i % 2 == 0 else (False, True)):
                    runs[w][plugin].append(timed(cwd, env, w, plugin))
            res["runs"] = [summary(w, runs[w]) for w in modes]
            report(res, a.out)


def report(res: dict[str, Any], out: Path | None) -> None:
    """Print (and write, after every pair: a run cut short keeps what it measured) the figures so far."""
    res["load_average_end"] = round(os.getloadavg()[0], 2)
    lines = [f"{res['command']}", f"machine: {res['machine']['cpu']}, {res['machine']['cores']} cores; "
             f"{res['machine']['date']}; load average {res['load_average_start']} at start, "
             f"{res['load_average_end']} at end", f"source: {res['source']}",
             f"plugin import after pytest: {res['import']['plugin_import_ms']} ms (median of 11, -X importtime); "
             f"{len(res['import']['modules'])} kvaudit modules"]
    for r in res["runs"]:
        w, c = r["wall_difference_ms"], r["cpu_difference_per_process_ms"]
        lines += [f"-n {r['workers']} ({r['processes']} process(es)), {r['pairs']} alternating pairs:",
                  f"  wall with kvaudit {r['wall_with_ms']['median']} ms, "
                  f"-p no:kvaudit {r['wall_without_ms']['median']} ms (medians)",
                  f"  paired wall difference: median {w['median']} ms (quartiles {w['q1']} .. {w['q3']}, "
                  f"range {w['min']} .. {w['max']})",
                  f"  paired CPU difference a process: median {c['median']} ms (quartiles {c['q1']} .. {c['q3']}, "
                  f"range {c['min']} .. {c['max']})",
                  f"  target: within {TARGET_MS:.0f} ms a process: {'ok' if r['ok'] else 'MISSED'}"]
    print("\n".join(lines), flush=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(res, indent=2) + "\n")
        out.with_suffix(".txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
