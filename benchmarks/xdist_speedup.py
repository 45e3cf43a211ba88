"""Wall-time speed-up of ``pytest suites -n 2`` over ``-n 0`` on the embedded checkpoint, in one run,
and the check that both give byte-identical figures in the JSON report (claims, items, analyses) and
run the same forward tokens (xdist workers take items from a shared queue and spend the transplant
budgets exactly as one process does).

    python benchmarks/xdist_speedup.py --n 200         # about 6 minutes on 2 idle cores

Run it on an idle machine: the load average before and after is printed, and a load above the core
count means other jobs shared the cores and the ratio understates the speed-up.
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


def run(workers: int, n: int, out: Path, device: str) -> float:
    cmd = [sys.executable, "-m", "pytest", str(REPO / "suites"), "-q", "-p", "no:cacheprovider", "-n", str(workers),
           f"--kvaudit-n={n}", f"--kvaudit-report={out}", f"--kvaudit-device={device}",
           "--deselect", "suites/test_ledger_audit.py"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=False, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="items of the embedded set (all 200 by default)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as d:
        r0, r2 = Path(d) / "n0.json", Path(d) / "n2.json"
        t0 = run(0, args.n, r0, args.device)
        t2 = run(2, args.n, r2, args.device)
        a, b = json.loads(r0.read_text()), json.loads(r2.read_text())
    load_after = os.getloadavg()[0]
    keys = ("claims", "items", "analyses")
    same = all(json.dumps(a[k], sort_keys=True) == json.dumps(b[k], sort_keys=True) for k in keys)
    tokens = (a["cost"]["forward_tokens"], b["cost"]["forward_tokens"])
    print(f"pytest suites on the embedded checkpoint, {args.n} items x bf16,fp32, 1 torch thread per process")
    print(f"load average before {load_before:.2f}, after {load_after:.2f} ({os.cpu_count()} cores)")
    print(f"{'mode':<8} {'wall s':>8} {'speed-up':>9} {'forward tokens':>15}")
    print(f"{'-n 0':<8} {t0:8.1f} {1.0:9.2f} {tokens[0]:>15}")
    print(f"{'-n 2':<8} {t2:8.1f} {t0 / t2:9.2f} {tokens[1]:>15}   target >= 1.80: "
          f"{'met' if t0 / t2 >= 1.8 else 'MISSED'}")
    print(f"claims, items and analyses byte-identical across modes: {'yes' if same else 'NO'}; "
          f"forward tokens equal: {'yes' if tokens[0] == tokens[1] else 'NO'}")
    if args.out:
        args.out.write_text(json.dumps({"n": args.n, "wall_n0": t0, "wall_n2": t2, "speedup": t0 / t2,
                                        "identical_figures": same, "forward_tokens": tokens,
                                        "load_before": load_before, "load_after": load_after}, indent=2))
    if not same or tokens[0] != tokens[1]:
        sys.exit(1)


if __name__ == "__main__":
    main()
