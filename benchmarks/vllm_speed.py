"""The same audit's forward tokens per second under vLLM and under transformers, in one run, as a ratio.

    python benchmarks/vllm_speed.py [--model DIR] [--n 4] [--dtype bf16] [--chat-template]

Run it in the vLLM venv (it has both engines). Each backend computes every cell of the first ``--n`` items
(the store's own pipeline: trajectory, replicas, constructions, the 2x2's cells, transplants on divergent
units) at one precision, one process; the model load is timed apart. The two backends do not run the same
tokens (vLLM's cells are requests: ``warm`` and ``batched(B)`` are its own, the boundary sits on a block edge),
so each rate is its own forward tokens over its own compute seconds, and the ratio is of the rates. Say the
load (``uptime``) beside the figures: the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import time

from pytest_kvaudit.core.compute.store import Store
from pytest_kvaudit.core.model.config import EMBEDDED_DIR, AuditConfig


def rate(backend: str, args: argparse.Namespace) -> tuple[float, int, float]:
    """(load seconds, forward tokens, compute seconds) of the audit's cells under ``backend``."""
    cfg = AuditConfig(model=args.model, backend=backend, n=args.n, dtypes=(args.dtype,),
                      chat_template=args.chat_template)
    store = Store.open(cfg)
    t = time.perf_counter()
    store.handle(args.dtype)
    load = time.perf_counter() - t
    t = time.perf_counter()
    store.compute()
    return load, store.cost.forward_tokens, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--model", default=str(EMBEDDED_DIR))
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--chat-template", action="store_true")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}; {args.n} items at {args.dtype}, model {args.model}")
    rates = {}
    for backend in ("transformers", "vllm"):
        load, tokens, seconds = rate(backend, args)
        rates[backend] = tokens / seconds
        print(f"{backend}: load {load:.1f} s, {tokens} forward tokens in {seconds:.1f} s = "
              f"{rates[backend]:.1f} tokens/s")
    print(f"vllm / transformers: {rates['vllm'] / rates['transformers']:.2f}x tokens/s")


if __name__ == "__main__":
    main()
