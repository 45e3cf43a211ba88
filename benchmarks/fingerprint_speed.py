"""Fingerprint throughput of a KV cache against hashlib and against a plain memory copy.

Why: every boundary state of every cell is fingerprinted (``pytest_kvaudit.core.runtime.state.fingerprint``: blake2b
over dtype, shape and the raw bytes of each layer's K and V), so on a big model the audit's exactness
checks are only as fast as that digest. The physical limit of anything that reads every byte once is a
memory copy of the same bytes; the target is a fingerprint at >= 50% of memcpy bandwidth.

One cache, built by filling a transformers ``DynamicCache`` with ``cache.update(k, v, layer_idx)``
(default 24 layers x K,V of (1, 8, 1024, 128) bf16 = 96 MiB) on ``--device``, measured side by side in
one run, interleaved, median of the repeats:

* ``kvaudit fingerprint(cache)``: what the store runs (on cuda it includes the device->host copy its
  ``tensor_bytes`` makes);
* ``hashlib.sha256`` and ``hashlib.blake2b`` over the same bytes (``tensor_bytes`` of each tensor, so the
  same host path as the fingerprint);
* memory copies of the same bytes: ``Tensor.clone()`` (allocate + copy), ``copy_`` into preallocated
  tensors, and on CPU ``numpy.copyto``; on cuda also the device->host copy alone. The fastest copy on
  the cache's own device is the memcpy reference.

GB/s counts the cache's bytes once (1 GB = 1e9 bytes) for hashes and copies alike.
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C

TARGET = 0.5


def build_cache(layers: int, heads: int, seq: int, head_dim: int, dtype: str, device: str) -> Any:
    """A DynamicCache holding ``layers`` random (K, V) pairs of shape (1, heads, seq, head_dim)."""
    import torch
    from transformers import DynamicCache

    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    g = torch.Generator(device="cpu").manual_seed(0)
    cache = DynamicCache()
    for i in range(layers):
        k = torch.randn((1, heads, seq, head_dim), generator=g).to(device=device, dtype=tdt)
        v = torch.randn((1, heads, seq, head_dim), generator=g).to(device=device, dtype=tdt)
        cache.update(k, v, i)
    return cache


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--heads", type=int, default=8, help="KV heads")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--repeats", type=int, default=7)
    a = ap.parse_args(argv)
    threads_line = C.setup_torch(a.threads)

    import numpy as np
    import torch

    from pytest_kvaudit.core.runtime import state as kv
    cache = build_cache(a.layers, a.heads, a.seq, a.head_dim, a.dtype, a.device)
    tensors = [t for pair in kv.layer_kv(cache) for t in pair]
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    on_cuda = a.device.startswith("cuda")

    def hash_with(make: Callable[[], Any]) -> Callable[[], str]:
        def run() -> str:
            h = make()
            for t in tensors:
                h.update(kv.tensor_bytes(t))
            return h.hexdigest()
        return run

    dst = [torch.empty_like(t) for t in tensors]

    def copy_into() -> None:
        for d, s in zip(dst, tensors):
            d.copy_(s)

    variants: dict[str, tuple[str, Callable[[], Any]]] = {
        "kvaudit fingerprint(cache)": ("hash", lambda: kv.fingerprint(cache)),
        "hashlib.sha256": ("hash", hash_with(hashlib.sha256)),
        "hashlib.blake2b (digest 16)": ("hash", hash_with(lambda: hashlib.blake2b(digest_size=16))),
        f"Tensor.clone() on {a.device}": ("copy", lambda: [t.clone() for t in tensors]),
        f"copy_ into preallocated on {a.device}": ("copy", copy_into),
    }
    if on_cuda:
        host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]

        def d2h_pinned() -> None:
            for d, s in zip(host, tensors):
                d.copy_(s, non_blocking=True)
            torch.cuda.synchronize()

        variants["device->host .cpu() (pageable)"] = ("d2h", lambda: [t.cpu() for t in tensors])
        variants["device->host into pinned"] = ("d2h", d2h_pinned)
    else:
        src_np = [t.view(torch.uint8).numpy() for t in tensors]
        dst_np = [np.empty_like(s) for s in src_np]

        def np_copy() -> None:
            for d, s in zip(dst_np, src_np):
                np.copyto(d, s)

        variants["numpy.copyto into preallocated"] = ("copy", np_copy)

    # warm up every variant once (page faults, allocator, CUDA context), and check the digest is stable
    fp0 = kv.fingerprint(cache)
    for _, fn in variants.values():
        C.timed(fn, a.device)
    assert kv.fingerprint(cache) == fp0, "fingerprint of an unchanged cache changed"

    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(a.repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for n in order:
            s, _ = C.timed(variants[n][1], a.device)
            times[n].append(s)
    gbps = {n: nbytes / C.median(times[n]) / 1e9 for n in names}
    memcpy_name = max((n for n in names if variants[n][0] == "copy"), key=lambda n: gbps[n])
    memcpy = gbps[memcpy_name]
    rows = [[n, variants[n][0], C.median(times[n]) * 1000, gbps[n], gbps[n] / memcpy] for n in names]
    shape = f"{a.layers} layers x K,V (1, {a.heads}, {a.seq}, {a.head_dim}) {a.dtype}"
    tab = C.table(f"fingerprint speed: {shape} = {nbytes / 2**20:.0f} MiB on {a.device}, median of {a.repeats} "
                  f"interleaved repeats (memcpy reference: {memcpy_name})",
                  ["operation", "kind", "ms", "GB/s", "x memcpy"], rows)
    fp = gbps["kvaudit fingerprint(cache)"]
    line, ok = C.target_line("fingerprint/memcpy bandwidth", fp / memcpy, ">=", TARGET)
    if not ok:
        print(f"kvaudit's blake2b fingerprint runs at {fp:.2f} GB/s, {fp / memcpy:.1%} of the {memcpy:.2f} GB/s "
              f"memcpy ({memcpy_name}); single-threaded blake2b is the bound "
              f"(hashlib.blake2b alone: {gbps['hashlib.blake2b (digest 16)']:.2f} GB/s, "
              f"sha256: {gbps['hashlib.sha256']:.2f} GB/s). kvaudit's code is unchanged.")
    C.write_json(a.out, {"benchmark": "fingerprint_speed", "threads": threads_line,
                         "environment": C.environment(a.device), "shape": shape, "bytes": nbytes,
                         "gbps": gbps, "times_s": times, "memcpy_reference": memcpy_name,
                         "ratio_fingerprint_memcpy": fp / memcpy, "table": tab,
                         "target": {"min_ratio": TARGET, "met": ok, "line": line}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
