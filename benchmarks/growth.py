"""Growth of the store's wall time and peak memory with the item count and the suffix length.

Why: the store is meant to scale linearly in forward tokens (a constant cost per token, whatever the
run's size) with flat memory (one item's caches alive at a time, records are small plain data). A
leak of caches or of per-item state would show as peak memory growing with the items; a quadratic
step (re-scanning records, re-digesting growing caches) as seconds per token growing.

Every point is a fresh subprocess (peak RSS is ``resource.getrusage(RUSAGE_SELF).ru_maxrss``, a
high-water mark, so points must not shard a process; ``tracemalloc`` does not see torch's allocator).
Each point loads the model, warms it up with a few forwards outside the store, notes the peak RSS, runs
``Store.compute()``, notes it again, and reports seconds per forward token of the compute alone. Two
sweeps at one precision (``--dtypes``, default fp32 only, to keep them within about 5 minutes on 2 cores):

* items: the embedded checkpoint at ``--items`` (default 50, 100, 200 items);
* suffix: a ``tiny_checkpoint`` (random 2-layer Llama, char tokenizer, boundary tokens:4) with
  ``max_new_tokens`` 24 and 48 (``AuditConfig.max_new_tokens``), i.e. 2x longer suffixes;
* big: a synthetic 1,000-item set on a ``tiny_checkpoint`` (``--big-items``, default 250 and 1000 items), each
  point also building the run's report (``session.run_info``: analyses, items, cost and the priced plan) and
  writing it as JSON: the whole audit of 1,000 items stays within memory with its report written.

Checks (printed, not asserted): linear = the spread (max/min) of seconds per token within a sweep is at
most 1.25, read on the process's CPU time (``time.process_time``: another job on the machine inflates
wall time, not this process's CPU time; on cuda, wall time); flat memory = the spread of peak RSS within
a sweep is at most 1.10. Wall seconds per token are printed alongside. The suffix sweep's points are short
(seconds), so each runs 3 times interleaved and the least-disturbed run (lowest CPU time per token) is
kept, with the highest peak RSS of the three (``--suffix-repeats``, ``--repeats`` for the items sweep).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C

LINEAR_SPREAD = 1.25
FLAT_SPREAD = 1.10
MARK = "GROWTH_POINT "


def maxrss_mib() -> float:
    """This process's peak resident set so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def warm_up(h: Any) -> None:
    """A few forwards outside the store (own cache, own cost): one-time kernel set-up is not charged to
    the first point's seconds per token."""
    from pytest_kvaudit.core.runtime.decoder import Decoder
    from pytest_kvaudit.engines.transformers.backend import TransformersBackend

    dec = Decoder(TransformersBackend.of_model(h.model, h.eos_ids), h.eos_ids)
    c = dec.fresh()
    dec.step([0] * 8, c)
    for _ in range(8):
        dec.step([0], c)


def run_point(spec: dict[str, Any]) -> dict[str, Any]:
    """In the subprocess: load, compute the store once, report tokens, seconds and peak memory."""
    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(spec["threads"])
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig

    kw: dict[str, Any] = {"model": spec["model"], "n": spec["n"], "dtypes": tuple(spec["dtypes"]),
                          "device": spec["device"], "threads": spec["threads"]}
    if spec.get("max_new_tokens"):
        kw["max_new_tokens"] = spec["max_new_tokens"]
    kw.update(C.config_extras(spec.get("sweep_units")))
    store = Store.open(AuditConfig(**kw))
    h = store.handle(store.cfg.dtypes[0])  # load the first model before the compute is timed
    warm_up(h)
    rss_loaded = maxrss_mib()
    cuda = spec["device"].startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    cpu0 = time.process_time()
    store.compute()
    cpu_s = time.process_time() - cpu0
    recs = list(store.records.values())
    report_bytes = None
    if spec.get("report"):  # the report as a run writes it, from the records
        from pytest_kvaudit.report.document import build, dumps
        from pytest_kvaudit.session import run_info

        info = run_info(store, store.cfg)
        text = dumps(build(info["model"], info["environment"], info["items"], {}, info["cost"],
                           analyses=info["analyses"], plan=info["plan"]))
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=True) as f:
            f.write(text)
        report_bytes = len(text)
    return {
        **spec,
        "items": len(store.items),
        "cells": len(recs),
        "eligible": sum(r.eligible for r in recs),
        "mean_generated": sum(len(r.generated) for r in recs) / max(1, len(recs)),
        "forward_calls": store.cost.forward_calls,
        "forward_tokens": store.cost.forward_tokens,
        "compute_s": store.cost.seconds,
        "us_per_token": store.cost.seconds / max(1, store.cost.forward_tokens) * 1e6,
        "cpu_s": cpu_s,
        "cpu_us_per_token": cpu_s / max(1, store.cost.forward_tokens) * 1e6,
        "rss_loaded_mib": rss_loaded,
        "rss_peak_mib": maxrss_mib(),
        "cuda_peak_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
        "process_s": time.perf_counter() - t_start,
        "report_bytes": report_bytes,
    }


def spawn(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one point in a fresh interpreter and parse its result line."""
    env = dict(os.environ, HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--point", json.dumps(spec)], capture_output=True, text=True,
                       env=env, check=False)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(MARK)]
    if p.returncode != 0 or not lines:
        raise SystemExit(f"growth point {spec} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(lines[-1][len(MARK):])
    out["wall_s"] = time.perf_counter() - t0
    return out


def best_of(specs: list[dict[str, Any]], repeats: int) -> list[dict[str, Any]]:
    """Run every point ``repeats`` times, interleaved (a, b, a, b, ...), each in its own subprocess; keep
    per point the least-disturbed run (lowest CPU time per token) and the highest peak RSS of all."""
    runs: list[list[dict[str, Any]]] = [[] for _ in specs]
    for _ in range(repeats):
        for i, spec in enumerate(specs):
            runs[i].append(spawn(spec))
    out = []
    for rs in runs:
        best = dict(min(rs, key=lambda r: r["cpu_us_per_token"]))
        best["rss_peak_mib"] = max(r["rss_peak_mib"] for r in rs)
        best["repeats"] = len(rs)
        best["all_cpu_us_per_token"] = [r["cpu_us_per_token"] for r in rs]
        best["all_us_per_token"] = [r["us_per_token"] for r in rs]
        out.append(best)
    return out


def spread(xs: list[float]) -> float:
    return max(xs) / min(xs) if xs and min(xs) > 0 else float("nan")


def report(title: str, key: str, pts: list[dict[str, Any]], cuda: bool) -> tuple[str, dict[str, Any]]:
    headers = [key, "cells", "mean gen", "fwd tokens", "tokens x", "wall s", "wall us/tok", "cpu us/tok",
               "RSS loaded MiB", "RSS peak MiB"] + (["cuda peak MiB"] if cuda else [])
    base = pts[0]["forward_tokens"]
    rows = [[p[key], p["cells"], p["mean_generated"], p["forward_tokens"], p["forward_tokens"] / base, p["compute_s"],
             p["us_per_token"], p["cpu_us_per_token"], p["rss_loaded_mib"], p["rss_peak_mib"]]
            + ([p["cuda_peak_mib"]] if cuda else []) for p in pts]
    tab = C.table(title, headers, rows)
    # the verdict reads CPU time: another job on the machine inflates wall time, not this process's CPU time
    # (on cuda the host waits on the device, so wall time is the figure there)
    basis = "us_per_token" if cuda else "cpu_us_per_token"
    s_tok = spread([p[basis] for p in pts])
    s_wall = spread([p["us_per_token"] for p in pts])
    s_rss = spread([p["rss_peak_mib"] for p in pts])
    lin, flat = s_tok <= LINEAR_SPREAD, s_rss <= FLAT_SPREAD
    print(f"  {'wall' if cuda else 'cpu'} seconds/token spread {s_tok:.3f} (linear if <= {LINEAR_SPREAD}): "
          f"{'LINEAR' if lin else 'NOT LINEAR'}" + ("" if cuda else f" (wall: {s_wall:.3f})")
          + f"; peak RSS spread {s_rss:.3f} (flat if <= {FLAT_SPREAD}): {'FLAT' if flat else 'NOT FLAT'}\n",
          flush=True)
    return tab, {"per_token_basis": basis, "per_token_spread": s_tok, "wall_per_token_spread": s_wall,
                 "linear": lin, "rss_peak_spread": s_rss, "flat": flat}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--point", default=None, help=argparse_hidden())
    ap.add_argument("--items", default="50,100,200", help="item counts of the items sweep")
    ap.add_argument("--model", default=None, help="checkpoint of the items sweep (default: embedded)")
    ap.add_argument("--dtypes", default="fp32", help="precisions per point (fp32 only by default, for time)")
    ap.add_argument("--suffix-model", default=None,
                    help="checkpoint of the suffix sweep (default: a tiny_checkpoint written to a temp dir)")
    ap.add_argument("--suffix-items", type=int, default=50)
    ap.add_argument("--suffix-tokens", default="24,48", help="max_new_tokens of the suffix sweep")
    ap.add_argument("--skip-suffix", action="store_true")
    ap.add_argument("--big-items", default="250,1000",
                    help="item counts of the big sweep (a synthetic item set on a tiny_checkpoint, report written)")
    ap.add_argument("--skip-big", action="store_true")
    ap.add_argument("--repeats", type=int, default=1, help="runs per point of the items sweep (best kept)")
    ap.add_argument("--suffix-repeats", type=int, default=3,
                    help="runs per point of the suffix sweep, interleaved (best kept): its points are short")
    ap.add_argument("--sweep-units", type=int, default=None,
                    help="divergent items that also get the layer sweep (default: the store's own default)")
    a = ap.parse_args(argv)
    if a.point:
        print(MARK + json.dumps(run_point(json.loads(a.point))), flush=True)
        return 0
    threads_line = C.setup_torch(a.threads)
    from pytest_kvaudit.core.model.config import EMBEDDED_DIR, parse_dtypes

    dtypes = list(parse_dtypes(a.dtypes))
    cuda = a.device.startswith("cuda")
    model = a.model or str(EMBEDDED_DIR)
    print(f"precisions per point: {','.join(dtypes)}; device {a.device}; one fresh subprocess per point\n", flush=True)
    t0 = time.perf_counter()
    common = {"dtypes": dtypes, "device": a.device, "threads": a.threads, "sweep_units": a.sweep_units}
    item_pts = best_of([{**common, "sweep": "items", "model": model, "n": int(n), "max_new_tokens": None}
                        for n in a.items.split(",")], a.repeats)
    label = "embedded" if not a.model else a.model
    t1, v1 = report(f"growth with items: {label}, {','.join(dtypes)}, best of {a.repeats}", "n", item_pts, cuda)
    out: dict[str, Any] = {"benchmark": "growth", "threads": threads_line, "environment": C.environment(a.device),
                           "items_sweep": {"points": item_pts, "table": t1, **v1}}
    if not a.skip_suffix:
        with tempfile.TemporaryDirectory() as tmp:
            smodel = a.suffix_model
            if smodel is None:
                from transformers.utils import logging as hf_logging

                from pytest_kvaudit.testing import tiny_checkpoint

                hf_logging.disable_progress_bar()
                smodel = str(tiny_checkpoint(Path(tmp) / "tiny", "llama", n_items=a.suffix_items,
                                             boundary="tokens:4", max_new_tokens=24))
            suf_pts = best_of([{**common, "sweep": "suffix", "model": smodel, "n": a.suffix_items,
                                "max_new_tokens": int(t)} for t in a.suffix_tokens.split(",")], a.suffix_repeats)
        slabel = "tiny_checkpoint llama (2 layers, hidden 32)" if a.suffix_model is None else a.suffix_model
        t2, v2 = report(f"growth with suffix length: {slabel}, boundary tokens:4, {a.suffix_items} items, "
                        f"{','.join(dtypes)}, best of {a.suffix_repeats} interleaved", "max_new_tokens", suf_pts, cuda)
        out["suffix_sweep"] = {"points": suf_pts, "table": t2, **v2}
    if not a.skip_big:
        with tempfile.TemporaryDirectory() as tmp:
            from transformers.utils import logging as hf_logging

            from pytest_kvaudit.testing import tiny_checkpoint

            hf_logging.disable_progress_bar()
            counts = [int(n) for n in a.big_items.split(",")]
            bmodel = str(tiny_checkpoint(Path(tmp) / "big", "llama", n_items=max(counts), boundary="tokens:4",
                                         max_new_tokens=24))
            big_pts = best_of([{**common, "sweep": "big", "model": bmodel, "n": n, "max_new_tokens": None,
                                "report": True} for n in counts], 1)
        t3, v3 = report(f"growth to {max(counts)} items: tiny_checkpoint llama (2 layers, hidden 32), synthetic items, "
                        f"{','.join(dtypes)}, report written", "n", big_pts, cuda)
        for pt in big_pts:
            print(f"  {pt['n']} items: report {pt['report_bytes'] / 1024:.1f} KiB, peak RSS {pt['rss_peak_mib']:.0f} "
                  f"MiB, {pt['process_s']:.0f}s in all", flush=True)
        out["big_sweep"] = {"points": big_pts, "table": t3, **v3}
    total = time.perf_counter() - t0
    print(f"growth: {total:.1f}s for all points")
    out["total_s"] = total
    C.write_json(a.out, out)
    return 0


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
