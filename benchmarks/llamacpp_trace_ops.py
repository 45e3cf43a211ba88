"""The first ggml op whose output differs between llama.cpp's one-shot prefill and its token-by-token build
(issue 30, part 6), read through llama.cpp's own eval callback (``cb_eval``, what ``llama-eval-callback`` uses).

    python benchmarks/llamacpp_trace_ops.py [--model FILE.gguf] [--items ID,ID] [--no-extra-bufts]
                                            [--flash-attn] [--out FILE.json]

For each item (``builtin:arith-v2``, chat template, f32 K/V cache, one thread), the item's greedy prefix
is computed as the audit does (``llamacpp_trace.py``), then ``prefix[:-1]`` is run twice on fresh contexts
with the callback on: as one ``llama_decode`` (prefill) and as ``[P, 1, 1, ...]`` (the live/replay
schedule). Every named f32 tensor of every graph is read when computed, cut into one row per token position
(the axis whose length is the batch's token count), and each row's bytes are digested. Rows of the same
tensor name and position are then compared, prefill against live: the report lists, in graph order, how
many positions differ per tensor, its op and the weight's type and buffer for a matmul, and the first
differing tensor of each layer. Where a tensor's bytes first differ while its inputs' rows agree is where
the kernels part.

The callback makes the scheduler compute the graph in pieces, which could stop ggml fusing ops; so the script
also checks that the K/V state bytes with the callback equal those without it (``callback_changes_state``).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402,F401
from llamacpp_trace import ITEMS, open_traced  # noqa: E402

from pytest_kvaudit.core.itemsets.builtin_items import builtin_item_set  # noqa: E402
from pytest_kvaudit.core.model.config import BoundaryRule  # noqa: E402
from pytest_kvaudit.core.model.schedules import schedule  # noqa: E402
from pytest_kvaudit.core.runtime.chat import chat_prompt_ids  # noqa: E402
from pytest_kvaudit.core.runtime.decoder import Decoder, trajectory  # noqa: E402


class GgmlTensor(ctypes.Structure):
    """``struct ggml_tensor`` of the ggml vendored in llama-cpp-python 0.3.36 (ggml.h: GGML_MAX_DIMS 4,
    GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""


GgmlTensor._fields_ = [
    ("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
    ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
    ("src", ctypes.POINTER(GgmlTensor) * 10), ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
    ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8),
]
GGML_TYPE_F32 = 0
LAYER = re.compile(r"-(\d+)(?=$| |#)")
#: per layer, the tensors whose differing positions the summary counts: attention's output, the attention
#: block's projection (where a quantized weight requantizes its input), the layer's output
PER_LAYER = ("kqv", "kqv_out", "attn_out", "ffn_out", "l_out")


def ggml_base() -> Any:
    import llama_cpp

    lib_dir = Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")
    lib = ctypes.CDLL(str(lib_dir / "libggml-base.so"))
    for fn in ("ggml_op_desc", "ggml_type_name"):
        getattr(lib, fn).restype = ctypes.c_char_p
    lib.ggml_op_desc.argtypes = [ctypes.POINTER(GgmlTensor)]
    lib.ggml_type_name.argtypes = [ctypes.c_int]
    lib.ggml_backend_buffer_name.restype = ctypes.c_char_p
    lib.ggml_backend_buffer_name.argtypes = [ctypes.c_void_p]
    return lib


class Recorder:
    """The eval callback: per computed f32 tensor, one digest per token row, keyed by (name, position)."""

    def __init__(self, lib: Any) -> None:
        self.lib, self.rows, self.order, self.info = lib, {}, [], {}
        self.axis: dict[str, int] = {}
        self.positions: list[int] = []
        self.seen: dict[str, int] = {}
        import llama_cpp.llama_cpp as lc

        self.fn = lc.ggml_backend_sched_eval_callback(self._cb)  # (tensor*, ask, user_data) -> bool

    def _cb(self, ptr: int, ask: bool, _ud: Any) -> bool:
        t = ctypes.cast(ptr, ctypes.POINTER(GgmlTensor)).contents
        if ask:
            return bool(t.name) and t.type == GGML_TYPE_F32
        self.record(t)
        return True

    def record(self, t: Any) -> None:
        import numpy as np

        name = t.name.decode()
        if name.startswith("cache_"):  # views of the K/V cache: inputs, whose unwritten cells differ by design
            return
        # llama.cpp names several nodes alike (Qcur-0: the matmul, then the rope): key by occurrence in the graph
        self.seen[name] = self.seen.get(name, 0) + 1
        name = f"{name}#{self.seen[name]}" if self.seen[name] > 1 else name
        ne, nb = list(t.ne), list(t.nb)
        n = len(self.positions)
        if name not in self.axis:  # learnt on the prefill graph, whose token count is unambiguous
            cands = [i for i in range(4) if ne[i] == n]
            self.axis[name] = cands[-1] if cands else (1 if ne[1] > 0 else 0)
        ax = self.axis[name]
        k = ne[ax]
        if k > n or t.data is None:
            return
        full = np.lib.stride_tricks.as_strided(
            np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_float)), shape=(1,)),
            shape=tuple(reversed(ne)), strides=tuple(reversed(nb)))
        cut = np.moveaxis(full, 3 - ax, 0)
        # a graph that keeps only the output rows (the last layer after inp_out_ids) holds the last k positions
        for r, pos in enumerate(self.positions[n - k:]):
            row = cut[r]
            if name.startswith("kq-"):  # K.Q against every cell: only the causal ones are written in both
                row = row[..., :pos + 1]
            self.rows[(name, pos)] = hashlib.sha1(np.ascontiguousarray(row).tobytes()).hexdigest()
        if name not in self.info:
            self.order.append(name)
            info = {"op": self.lib.ggml_op_desc(ctypes.byref(t)).decode(), "ne": ne}
            if info["op"] == "MUL_MAT" and t.src[0]:
                w = t.src[0].contents
                info["src0"] = f"{self.lib.ggml_type_name(w.type).decode()} {w.name.decode()}"
                if w.buffer:
                    info["src0_buffer"] = self.lib.ggml_backend_buffer_name(w.buffer).decode()
            self.info[name] = info


def run(b: Any, rec: Recorder | None, head: list[int], chunks: list[int]) -> bytes:
    """``head`` fed in ``chunks`` on a fresh context (with the callback when given); its state bytes."""
    import llama_cpp.llama_cpp as lc

    cp = b.llm.context_params
    cp.cb_eval = rec.fn if rec is not None else lc.ggml_backend_sched_eval_callback(0)
    cp.cb_eval_user_data = None
    try:
        st = b.fresh()
    finally:
        cp.cb_eval = lc.ggml_backend_sched_eval_callback(0)
    pos = 0
    for c in chunks:
        if rec is not None:
            rec.positions, rec.seen = list(range(pos, pos + c)), {}
        b.step(head[pos:pos + c], st)
        pos += c
    return bytes(st.state_bytes())


def trace_item(b: Any, lib: Any, item: Any, iset: Any) -> dict[str, Any]:
    dec = Decoder(b)
    prompt = list(chat_prompt_ids(b.tokenizer, item.prompt))
    tr = trajectory(dec, prompt, iset.max_new_tokens, BoundaryRule.parse(item.boundary or iset.boundary), b.decode)
    if tr.reason is not None:
        return {"id": item.id, "eligible": False, "reason": tr.reason}
    head = list(tr.prefix[:-1])
    live_chunks = schedule("live", len(prompt), len(head))
    pre, liv = Recorder(lib), Recorder(lib)
    pre_state = run(b, pre, head, [len(head)])
    liv.axis = dict(pre.axis)
    live_state = run(b, liv, head, live_chunks)
    plain_pre, plain_live = run(b, None, head, [len(head)]), run(b, None, head, live_chunks)
    tensors, first_per_layer = [], {}
    for name in pre.order:
        poss = sorted(p for (nm, p) in pre.rows if nm == name)
        diff = [p for p in poss if (name, p) in liv.rows and liv.rows[(name, p)] != pre.rows[(name, p)]]
        row = {"tensor": name, **pre.info[name], "positions": len(poss), "differ": len(diff),
               "differ_in_prompt": sum(p < len(prompt) for p in diff), "first_positions": diff[:8]}
        tensors.append(row)
        m = LAYER.search(name)
        layer = m.group(1) if m else "out"
        if diff and layer not in first_per_layer:
            first_per_layer[layer] = row
    first = next((t for t in tensors if t["differ"]), None)
    per_layer: dict[str, dict[str, int]] = {}
    for t in tensors:
        m = LAYER.search(t["tensor"])
        base = t["tensor"][:m.start()] if m else ""
        if m and base in PER_LAYER and t["tensor"] == f"{base}-{m.group(1)}":
            per_layer.setdefault(m.group(1), {})[base] = t["differ"]
    return {"id": item.id, "eligible": True, "prompt_len": len(prompt), "head_len": len(head),
            "states_equal": pre_state == live_state,
            "callback_changes_state": (pre_state, live_state) != (plain_pre, plain_live),
            "first_differing_tensor": first, "first_per_layer": first_per_layer,
            "positions_differing_per_layer": per_layer, "tensors": tensors}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--items", default="arith2-0000-add3", help="comma-separated item ids of builtin:arith-v2")
    ap.add_argument("--n", type=int, default=16, help="how many items of the set to look the ids up in")
    ap.add_argument("--no-extra-bufts", action="store_true")
    ap.add_argument("--flash-attn", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.model is None:
        from pytest_kvaudit.testing import smollm2

        args.model = str(smollm2()[0])
    t0, load = time.perf_counter(), os.getloadavg()[0]
    b = open_traced(args.model, 512, not args.no_extra_bufts, args.flash_attn)
    lib = ggml_base()
    iset = builtin_item_set(args.n, ITEMS)
    wanted = args.items.split(",")
    out = []
    for item in (i for i in iset.items if i.id in wanted):
        r = trace_item(b, lib, item, iset)
        out.append(r)
        if not r["eligible"]:
            print(f"{r['id']}: {r['reason']}")
            continue
        print(f"{r['id']}: P={r['prompt_len']} len={r['head_len']} states equal {r['states_equal']}, "
              f"callback changes state {r['callback_changes_state']}")
        for layer, t in list(r["first_per_layer"].items())[:6]:
            print(f"  layer {layer}: first differing {t['tensor']} ({t['op']}{', ' + t['src0'] if 'src0' in t else ''}"
                  f"{' in ' + t['src0_buffer'] if 'src0_buffer' in t else ''}) at {t['differ']}/{t['positions']} "
                  f"positions {t['first_positions']}, {t['differ_in_prompt']} in the prompt")
        print("  positions differing per layer (" + ", ".join(PER_LAYER) + "): " + "; ".join(
            f"{layer}: " + "/".join(str(v.get(k, "-"))
                                    for k in PER_LAYER) for layer, v in r["positions_differing_per_layer"].items()))
        for t in r["tensors"][:30]:
            print(f"    {t['tensor']:<16} {t['op']:<10} {t.get('src0', ''):<28} {t.get('src0_buffer', ''):<6} "
                  f"differ {t['differ']}/{t['positions']}")
    meta = {"model": Path(args.model).name, "kv_cache": "f32", "n_ubatch": 512,
            "use_extra_bufts": not args.no_extra_bufts,
            "flash_attn": args.flash_attn, "lib": os.environ.get("LLAMA_CPP_LIB_PATH", "llama-cpp-python 0.3.36 wheel"),
            "system_info": b.environment["llama_cpp_system_info"], "seconds": round(time.perf_counter() - t0, 1),
            "load_average_at_start": round(load, 2)}
    print(json.dumps(meta))
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        # one line per tensor: readable in a diff at a fraction of an indented dump's size
        items = [json.dumps({k: v for k, v in r.items() if k != "tensors"})[:-1] + ', "tensors": [\n'
                 + ",\n".join("   " + json.dumps(t) for t in r.get("tensors", [])) + "\n  ]}" for r in out]
        tmp.write_text('{"meta": ' + json.dumps(meta) + ',\n "items": [\n  ' + ",\n  ".join(items) + "\n]}\n")
        tmp.replace(path)


if __name__ == "__main__":
    main()
