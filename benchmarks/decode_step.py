"""Per-token cost of kvaudit's decode step before and after the lean step, beside a plain forward loop and HF
``generate``, on the same tokens.

Why: an audit is ~90% one-token forwards (issue 30: a 200-item SmolLM2 audit priced at 7,303 s), so the cost
of one decode step is the audit's cost. transformers' forward wraps the model's ops in ~20 module calls,
decorators and a mask builder per layer; :class:`pytest_kvaudit.core.runtime.lean_step.LeanStep` calls the same
ops directly. This script measures, in one run, on each model and precision, interleaved (the order rotates
every repeat), the median of ``--repeats``:

* ``kvaudit trajectory, lean step``: ``trajectory(Decoder(backend))`` as the store runs it (the default);
* ``kvaudit trajectory, transformers forward``: the same with ``backend.lean = False`` (before);
* ``plain forward loop``: ``model(input_ids, cache=DynamicCache, logits_to_keep=1)`` and argmax, nothing else;
* ``HF generate``: greedy, EOS off, exactly T new tokens.

Both wall time and this process's CPU time (``time.process_time``: a shared machine inflates the wall, less so
the CPU time) per generated token. The lean and transformers trajectories must agree bit for bit (generated
ids, the boundary state's fingerprint and the digest of every logits vector), and every loop must produce
generate's tokens; a mismatch is printed. No target is asserted: the figures are printed as measured.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C
from decode_overhead import first_mismatch, run_generate


def run_trajectory(backend: Any, prompt: Sequence[int], T: int, lean: bool) -> tuple[tuple[int, ...], tuple[str, str]]:
    """kvaudit's live path (``tokens:1`` boundary, no EOS) with the lean step on or off."""
    from pytest_kvaudit.core.model.config import BoundaryRule
    from pytest_kvaudit.core.runtime.decoder import Decoder, trajectory

    backend.lean = lean
    tr = trajectory(Decoder(backend, frozenset()), list(prompt), T, BoundaryRule(tokens=1), lambda ids: "")
    return tuple(tr.generated), (tr.state_fp or "", tr.logits_fp or "")


def run_plain(model: Any, prompt: Sequence[int], T: int) -> tuple[tuple[int, ...], tuple[str, str]]:
    """transformers' forward in a bare loop: prefill, then argmax and one-token forwards."""
    import torch

    from pytest_kvaudit.core.runtime import state as kv

    cache = kv.new_cache(model)
    key = kv.cache_kwarg(model)
    dev = next(model.parameters()).device
    out: list[int] = []
    x = torch.tensor([list(prompt)], dtype=torch.long, device=dev)
    with torch.no_grad():
        while True:
            logits = model(input_ids=x, use_cache=True, logits_to_keep=1, **{key: cache}).logits[0, -1]
            out.append(int(logits.argmax().item()))
            if len(out) >= T:
                return tuple(out), ("", "")
            x = torch.tensor([[out[-1]]], dtype=torch.long, device=dev)


def measure(label: str, backend: Any, prompt: Sequence[int], T: int, repeats: int, device: str) -> dict[str, Any]:
    model = backend.model
    variants: dict[str, Callable[[], tuple[tuple[int, ...], Any]]] = {
        "kvaudit trajectory, lean step": lambda: run_trajectory(backend, prompt, T, True),
        "kvaudit trajectory, transformers forward": lambda: run_trajectory(backend, prompt, T, False),
        "plain forward loop": lambda: run_plain(model, prompt, T),
        "HF generate": lambda: (run_generate(model, prompt, T)[0], ("", "")),
    }
    names = list(variants)
    out0 = {name: variants[name]() for name in names}  # warm-up; its tokens and digests are the ones checked
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            c0 = time.process_time()
            s, _ = C.timed(variants[name], device)
            cpu[name].append(time.process_time() - c0)
            wall[name].append(s)
    ref, lean_name, hf_name = "HF generate", names[0], names[1]
    bits = out0[lean_name] == out0[hf_name]
    rows, res = [], {}
    for name in names:
        w, c = C.median(wall[name]), C.median(cpu[name])
        mm = first_mismatch(out0[name][0], out0[ref][0])
        rows.append([name, w * 1000 / T, c * 1000 / T, w / C.median(wall[ref]), c / C.median(cpu[ref]),
                     c / C.median(cpu["plain forward loop"]), "yes" if mm is None else f"NO (first at {mm})"])
        res[name] = {"wall_s": wall[name], "cpu_s": cpu[name], "median_wall_s": w, "median_cpu_s": c,
                     "same_tokens_as_generate": mm is None}
    speedup_cpu = C.median(cpu[hf_name]) / C.median(cpu[lean_name])
    speedup_wall = C.median(wall[hf_name]) / C.median(wall[lean_name])
    table = C.table(f"decode step: {label}, prompt {len(prompt)} tokens, {T} new tokens, median of {repeats} "
                    f"interleaved repeats; lean = transformers bit for bit: {'yes' if bits else 'NO'}; "
                    f"lean speed-up {speedup_cpu:.3f}x CPU, {speedup_wall:.3f}x wall",
                    ["loop", "wall ms/token", "CPU ms/token", "wall x generate", "CPU x generate", "CPU x plain loop",
                     "same tokens"], rows)
    return {"model": label, "prompt_tokens": len(prompt), "new_tokens": T, "repeats": repeats, "variants": res,
            "lean_bit_identical": bits, "lean_reason": getattr(backend._lean, "reason", None),
            "lean_speedup_cpu": speedup_cpu, "lean_speedup_wall": speedup_wall, "table": table}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="checkpoint folder (default: SmolLM2-135M-Instruct via testing.smollm2())")
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--skip-embedded", action="store_true", help="leave out the embedded checkpoint (64 tokens)")
    a = ap.parse_args(argv)
    threads_line = C.setup_torch(a.threads)

    from pytest_kvaudit.core.model.config import EMBEDDED_DIR, parse_dtypes
    from pytest_kvaudit.core.model.items import load_item_set
    from pytest_kvaudit.core.runtime.chat import chat_prompt_ids
    from pytest_kvaudit.engines.transformers.backend import open_backend

    if a.model is None:
        from pytest_kvaudit.testing import smollm2

        a.model = str(smollm2()[1])
    results = []
    runs = [] if a.skip_embedded else [(str(EMBEDDED_DIR), False, 64)]
    runs.append((a.model, True, a.tokens))
    for path, chat, T in runs:
        for d in parse_dtypes(a.dtypes):
            b = open_backend(path, d, a.device)
            if chat:
                prompt = list(chat_prompt_ids(b.tokenizer, "Compute 12 + 25, step by step.", path))
            else:
                item = load_item_set(EMBEDDED_DIR / "items.jsonl", 1, None, None, None).items[0]
                prompt = b.encode(str(item.prompt))
            label = f"{Path(path).name} ({C.n_params(b.model) / 1e6:.1f}M params, {d}, {a.device})"
            results.append(measure(label, b, prompt, T, a.repeats, a.device))
            del b
    if not all(r["lean_bit_identical"] for r in results):
        print("note: the lean step differed from transformers' forward somewhere (see the tables)")
    C.write_json(a.out, {"benchmark": "decode_step", "threads": threads_line, "environment": C.environment(a.device),
                         "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
