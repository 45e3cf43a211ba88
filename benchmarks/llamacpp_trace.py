"""Where llama.cpp's one-shot prefill and its token-by-token cache part, bit for bit (issue 30, part 6).

    python benchmarks/llamacpp_trace.py [--model FILE.gguf] [--n 16] [--ubatch 512] [--no-extra-bufts]
                                        [--flash-attn] [--out FILE.json]

For each of the first ``--n`` items of ``builtin:arith-v2`` in the GGUF's chat template, at an f32 K/V cache,
one thread, it builds what ``fixed_prefix_2x2`` builds at fp32: the item's own greedy prefix, then on fresh
contexts the teacher-forced replay (``[P, 1, 1, ...]``: the prompt in one ``llama_decode``, then one token a
decode, which is how the live cache was built) and the one-shot prefill (``[len]``), each continued greedily.
It compares the two boundary states byte for byte, per layer, K and V, per cell (one position each), and the
two suffixes. The knobs are the ones llama.cpp has at run time:

- ``--ubatch``: the context's ``n_ubatch`` (``n_batch`` stays 512): at 1, llama.cpp splits every decode into
  one-token micro-batches, so prefill runs the kernels of a decode step;
- ``--no-extra-bufts``: the model's ``use_extra_bufts`` off: no AMX / repacked weight buffers, so a
  quantized weight's matmul takes ggml's own ``vec_dot`` for every batch size;
- ``--flash-attn``: ``flash_attn_type`` enabled (the backend turns it on only for a q8_0 cache).

``LLAMA_CPP_LIB_PATH`` (read by llama-cpp-python) swaps in another build of the same llama.cpp, e.g. one
configured with ``-DGGML_LLAMAFILE=OFF``. Nothing here changes the backend: it opens it as the audit does and
sets these on the contexts it creates.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/_common: the working tree on sys.path
import _common  # noqa: E402,F401

from pytest_kvaudit.core.itemsets.builtin_items import builtin_item_set  # noqa: E402
from pytest_kvaudit.core.model.config import BoundaryRule  # noqa: E402
from pytest_kvaudit.core.model.schedules import schedule  # noqa: E402
from pytest_kvaudit.core.runtime.backends import open_backend  # noqa: E402
from pytest_kvaudit.core.runtime.chat import chat_prompt_ids  # noqa: E402
from pytest_kvaudit.core.runtime.decoder import Decoder, continue_greedy, trajectory  # noqa: E402

ITEMS = "builtin:arith-v2"


def open_traced(model: str, ubatch: int, extra_bufts: bool, flash_attn: bool) -> Any:
    """The audit's own llama.cpp backend at fp32, with the run-time knobs set on every context it creates."""
    import llama_cpp.llama_cpp as lc

    default = lc.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = extra_bufts
        return p

    lc.llama_model_default_params = params  # read by Llama.__init__ while it loads the weights
    try:
        b = open_backend("llama.cpp", model, "fp32")
    finally:
        lc.llama_model_default_params = default
    cp = b.llm.context_params
    cp.n_ubatch = ubatch
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    probe = b.fresh()
    assert lc.llama_n_ubatch(probe.ctx) == ubatch, "n_ubatch did not reach the context"
    return b


def kv_cells(blob: bytes, n_layer: int, cells: int, n_embd_k: int,
             n_embd_v: int) -> tuple[list[list[bytes]], list[list[bytes]]]:
    """Per layer, per cell: the K row and the V row of an f32 cache in ``llama_state_seq_get_data``'s bytes.

    The K/V section is the blob's tail (``state_write_data``: v_trans, n_layer, then per layer the K type, row
    size and rows; then per layer V: as K when not transposed (flash attention), else its type, element size,
    n_embd_v and one run of cells per channel). Its start is found from its size and checked against the
    header it must have."""
    k_layer = 4 + 8 + cells * n_embd_k * 4
    for v_trans, v_layer in ((1, 4 + 4 + 4 + cells * n_embd_v * 4), (0, 4 + 8 + cells * n_embd_v * 4)):
        start = len(blob) - (8 + n_layer * (k_layer + v_layer))
        if start >= 0 and struct.unpack_from("<II", blob, start) == (v_trans, n_layer):
            break
    else:
        raise SystemExit(f"state layout not understood: no K/V section of {n_layer} layers x {cells} cells at its tail")
    at = start + 8

    def rows(n_embd: int) -> list[bytes]:
        nonlocal at
        typ, row = struct.unpack_from("<iQ", blob, at)
        assert typ == 0 and row == n_embd * 4, (typ, row)
        at += 12 + cells * row
        return [blob[at - cells * row + c * row: at - cells * row + (c + 1) * row] for c in range(cells)]

    ks = [rows(n_embd_k) for _ in range(n_layer)]
    vs = []
    for _ in range(n_layer):
        if not v_trans:
            vs.append(rows(n_embd_v))
            continue
        vtype, vel, nv = struct.unpack_from("<iII", blob, at)
        assert vtype == 0 and vel == 4 and nv == n_embd_v, (vtype, vel, nv)
        at += 12
        chans = [blob[at + j * cells * 4: at + (j + 1) * cells * 4] for j in range(nv)]
        vs.append([b"".join(ch[c * 4:(c + 1) * 4] for ch in chans) for c in range(cells)])
        at += nv * cells * 4
    assert at == len(blob)
    return ks, vs


def compare_states(a: bytes, b: bytes, shape: dict[str, int], cells: int, prompt_len: int) -> dict[str, Any]:
    """Which (layer, K/V, position) cells differ between two boundary states of one sequence."""
    if a == b:
        return {"equal": True}
    n_layer, n_embd = shape["layers"], shape["kv_heads"] * shape["head_dim"]
    ka, va = kv_cells(a, n_layer, cells, n_embd, n_embd)
    kb, vb = kv_cells(b, n_layer, cells, n_embd, n_embd)
    diff = {(layer, part, pos) for part, (x, y) in (("K", (ka, kb)), ("V", (va, vb)))
            for layer in range(n_layer) for pos in range(cells) if x[layer][pos] != y[layer][pos]}
    first_layer = min(d[0] for d in diff)
    in_first = sorted(d for d in diff if d[0] == first_layer)
    return {"equal": False, "cells_differing": len(diff), "cells_total": 2 * n_layer * cells,
            "first_layer": first_layer, "first_layer_parts": sorted({d[1] for d in in_first}),
            "first_layer_positions": sorted({d[2] for d in in_first}),
            "prompt_positions_differing": sorted({d[2] for d in diff if d[2] < prompt_len}),
            "earliest_position": min(d[2] for d in diff)}


def unit(b: Any, dec: Decoder, item: Any, iset: Any) -> dict[str, Any]:
    """One item's fixed-prefix fp32 unit: replay vs prefill, states and suffixes."""
    prompt = list(chat_prompt_ids(b.tokenizer, item.prompt))
    rule = BoundaryRule.parse(item.boundary or iset.boundary)
    tr = trajectory(dec, prompt, iset.max_new_tokens, rule, b.decode, keep_state=True)
    if tr.reason is not None:
        return {"id": item.id, "eligible": False, "reason": tr.reason}
    head, last = list(tr.prefix[:-1]), tr.prefix[-1]
    budget = iset.max_new_tokens - tr.boundary
    built = {}
    for name in ("incremental", "prefill"):
        st = dec.build_state(head, schedule(name, len(prompt), len(head)))
        built[name] = (st.state_bytes(), continue_greedy(dec, st, last, budget)[0])
    (rb, rs), (pb, ps) = built["incremental"], built["prefill"]
    return {"id": item.id, "eligible": True, "prompt_len": len(prompt), "head_len": len(head),
            "replay_equals_live_state": rb == tr.state.state_bytes(),
            "suffix_differs": rs != ps, "suffix_len": [len(rs), len(ps)],
            "state": compare_states(rb, pb, b.shape(), len(head), len(prompt))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: SmolLM2-135M-Instruct Q4_1)")
    ap.add_argument("--n", type=int, default=16)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--no-extra-bufts", action="store_true")
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.model is None:
        from pytest_kvaudit.testing import smollm2

        args.model = str(smollm2()[0])
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    b = open_traced(args.model, args.ubatch, not args.no_extra_bufts, args.flash_attn)
    dec = Decoder(b)
    iset = builtin_item_set(args.n, ITEMS)
    units = []
    for item in iset.items:
        u = unit(b, dec, item, iset)
        units.append(u)
        s = u.get("state", {})
        print(f"{u['id']}: " + (u.get("reason") or (f"P={u['prompt_len']} len={u['head_len']} state "
              + ("equal" if s["equal"] else f"differs from layer {s['first_layer']} {''.join(s['first_layer_parts'])} "
                 f"at {s['first_layer_positions'][:6]}, prompt positions {s['prompt_positions_differing'][:4]}")
              + f", suffix {'DIFFERS' if u['suffix_differs'] else 'same'}")), flush=True)
    ok = [u for u in units if u["eligible"]]
    summary = {
        "model": Path(args.model).name, "weights": b.identity["gguf"]["quantization"], "kv_cache": "f32",
        "n_ubatch": args.ubatch, "n_batch": 512, "use_extra_bufts": not args.no_extra_bufts,
        "flash_attn": args.flash_attn, "lib": os.environ.get("LLAMA_CPP_LIB_PATH", "llama-cpp-python 0.3.36 wheel"),
        "items": f"{ITEMS} first {args.n}, chat template", "units": len(ok),
        "states_differ": sum(not u["state"]["equal"] for u in ok),
        "suffixes_differ": sum(u["suffix_differs"] for u in ok),
        "replay_equals_live": sum(u["replay_equals_live_state"] for u in ok),
        "units_with_prompt_positions_differing": sum(bool(u["state"].get("prompt_positions_differing")) for u in ok),
        "system_info": b.environment["llama_cpp_system_info"],
        "seconds": round(time.perf_counter() - t0, 1), "load_average_at_start": round(load, 2),
    }
    print(json.dumps(summary, indent=1))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({"summary": summary, "units": units}, indent=1) + "\n")
        tmp.replace(out)


if __name__ == "__main__":
    main()
