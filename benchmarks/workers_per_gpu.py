"""Throughput of the audit with 1, 2 and 4 xdist workers sharing one device, side by side in one run.

Batch-1 decoding leaves most of a GPU idle, so under ``-n N`` with fewer GPUs than workers kvaudit puts
several workers on one GPU (worker i takes GPU i mod the GPU count). This measures what that buys: the
same ``pytest`` run of the claim suite with ``-n 1``, ``-n 2`` and ``-n 4`` with one GPU visible
(``CUDA_VISIBLE_DEVICES`` set to the first one), wall time, forward tokens per second and the speed-up
over one worker, and checks that the figures are identical whatever the worker count.

    python benchmarks/workers_per_gpu.py --model CKPT --n 32                # on a GPU runner
    python benchmarks/workers_per_gpu.py --device cpu --workers 1,2 --n 8   # smoke test on a CPU

Each worker holds its own copy of the weights: pick the worker count so that the copies and their
caches fit (``pytest --kvaudit-model=CKPT --kvaudit-plan`` prints both).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(workers: int, args: argparse.Namespace, out: Path) -> float:
    env = dict(os.environ)
    if args.device.startswith("cuda"):
        first = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
        env["CUDA_VISIBLE_DEVICES"] = first  # one GPU: every worker shares it
    cmd = [sys.executable, "-m", "pytest", str(REPO / "suites"), "-q", "-p", "no:cacheprovider", "-n", str(workers),
           f"--kvaudit-model={args.model}", f"--kvaudit-n={args.n}", f"--kvaudit-report={out}",
           f"--kvaudit-device={'cuda' if args.device.startswith('cuda') else args.device}",
           "--deselect", str(REPO / "suites" / "test_ledger_audit.py")]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, env=env, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if not out.exists():
        sys.exit(f"-n {workers} wrote no report (exit {res.returncode}):\n{res.stdout[-3000:]}")
    return wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="embedded", help="checkpoint folder (default: the embedded checkpoint)")
    ap.add_argument("--n", type=int, default=32, help="items")
    ap.add_argument("--workers", default="1,2,4", help="worker counts to compare")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    rows, reports = [], {}
    with tempfile.TemporaryDirectory() as d:
        for w in counts:
            path = Path(d) / f"n{w}.json"
            wall = run(w, args, path)
            reports[w] = json.loads(path.read_text())
            rows.append((w, wall, reports[w]["cost"]["forward_tokens"]))
    base = rows[0][1]
    keys = ("claims", "items", "analyses")
    same = all(json.dumps(reports[w][k], sort_keys=True) == json.dumps(reports[counts[0]][k], sort_keys=True)
               for w in counts for k in keys)
    print(f"pytest suites on {args.model}, {args.n} items, device {args.device} (one visible), "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'workers':>7} {'wall s':>8} {'tokens/s':>9} {'x 1 worker':>10}")
    for w, wall, tokens in rows:
        print(f"{w:>7} {wall:8.1f} {tokens / wall:9.0f} {base / wall:10.2f}")
    print(f"claims, items and analyses byte-identical across worker counts: {'yes' if same else 'NO'}")
    if args.out:
        args.out.write_text(json.dumps({"model": args.model, "n": args.n, "device": args.device, "identical": same,
                                        "rows": [{"workers": w, "wall_s": wall, "forward_tokens": t}
                                                 for w, wall, t in rows]}, indent=2))
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
