"""Overhead of kvaudit's greedy decode loop against Hugging Face ``model.generate``.

Why: kvaudit drives the model one forward at a time from Python (it must, to snapshot the cache at the
boundary and digest every logits vector), so its loop must cost no more than ``generate``'s own greedy
loop on the same model, prompt and token count, or the audit pays for its bookkeeping.

Measured side by side in one run, interleaved (the order rotates every repeat), median of the repeats:

* ``kvaudit trajectory``: ``trajectory(Decoder(model, no eos), prompt, T, tokens:1)``, the store's live
  path (prompt prefill, then T-1 one-token steps, boundary fingerprint and logits digests included);
* ``kvaudit continue_greedy``: a fresh cache filled with ``prompt[:-1]`` (``Decoder.build_state``), then
  ``continue_greedy`` from ``prompt[-1]`` for T tokens (one forward more than ``generate``);
* ``Decoder.step loop (argmax only)``: the bare loop on ``Decoder.step`` (what the two above cost beyond
  their bookkeeping: boundary fingerprint, logits digests, top-2 margins);
* ``HF generate``: ``model.generate(input_ids, do_sample=False, max_new_tokens=T, min_new_tokens=T)``
  with EOS disabled (``eos_token_id=None``), so both run exactly T new tokens.

Both must produce the same tokens; a mismatch is printed with its first position. Target: the
trajectory / generate wall ratio <= 1.0 on the embedded checkpoint. The second model is a random Llama
(``--llama-preset``, default ~110M parameters) built with ``AutoModelForCausalLM.from_config``.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C

TARGET = 1.0


def run_trajectory(model: Any, prompt: Sequence[int], T: int) -> tuple[tuple[int, ...], int]:
    """kvaudit's live path with a ``tokens:1`` boundary and no EOS: T generated tokens."""
    from pytest_kvaudit.core.model.config import BoundaryRule
    from pytest_kvaudit.core.runtime.decoder import Decoder, trajectory
    from pytest_kvaudit.engines.transformers.backend import TransformersBackend

    dec = Decoder(TransformersBackend.of_model(model), frozenset())
    tr = trajectory(dec, list(prompt), T, BoundaryRule(tokens=1), lambda ids: "")
    return tuple(tr.generated), dec.cost.forward_calls


def run_continue(model: Any, prompt: Sequence[int], T: int) -> tuple[tuple[int, ...], int]:
    """A fresh cache over ``prompt[:-1]`` in one forward, then ``continue_greedy`` for T tokens."""
    from pytest_kvaudit.core.runtime.decoder import Decoder, continue_greedy
    from pytest_kvaudit.engines.transformers.backend import TransformersBackend

    dec = Decoder(TransformersBackend.of_model(model), frozenset())
    state = dec.build_state(list(prompt[:-1]), [len(prompt) - 1])
    suffix, _ = continue_greedy(dec, state, int(prompt[-1]), T)
    return tuple(suffix), dec.cost.forward_calls


def run_step_loop(model: Any, prompt: Sequence[int], T: int) -> tuple[tuple[int, ...], int]:
    """The bare loop on kvaudit's ``Decoder.step``: prompt prefill, then argmax and one-token steps, no
    boundary snapshot, digests or margins (what ``trajectory``'s bookkeeping costs on top of the loop)."""
    from pytest_kvaudit.core.runtime.decoder import Decoder
    from pytest_kvaudit.engines.transformers.backend import TransformersBackend

    dec = Decoder(TransformersBackend.of_model(model), frozenset())
    cache = dec.fresh()
    logits = dec.step(list(prompt), cache)
    out: list[int] = []
    while True:
        tok = int(logits.argmax().item())
        out.append(tok)
        if len(out) >= T:
            break
        logits = dec.step([tok], cache)
    return tuple(out), dec.cost.forward_calls


def run_generate(model: Any, prompt: Sequence[int], T: int) -> tuple[tuple[int, ...], int]:
    """Hugging Face greedy ``generate`` for exactly T new tokens (EOS disabled)."""
    import torch

    x = torch.tensor([list(prompt)], dtype=torch.long, device=next(model.parameters()).device)
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=T,
                             min_new_tokens=T, eos_token_id=None, pad_token_id=pad)
    return tuple(int(t) for t in out[0, len(prompt):].tolist()), T


def first_mismatch(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def measure(label: str, model: Any, prompt: Sequence[int], T: int, repeats: int, device: str) -> dict[str, Any]:
    """One model: warm each variant, check tokens, then ``repeats`` interleaved timings of each."""
    variants: dict[str, Callable[[Any, Sequence[int], int], tuple[tuple[int, ...], int]]] = {
        "kvaudit trajectory": run_trajectory,
        "kvaudit continue_greedy": run_continue,
        "Decoder.step loop (argmax only)": run_step_loop,
        "HF generate": run_generate,
    }
    tokens: dict[str, tuple[int, ...]] = {}
    calls: dict[str, int] = {}
    def call(name: str) -> Callable[[], tuple[tuple[int, ...], int]]:
        return lambda: variants[name](model, prompt, T)

    for name in variants:  # warm-up run; its tokens are the ones checked
        _, (toks, n_calls) = C.timed(call(name), device)
        tokens[name], calls[name] = toks, n_calls
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for rep in range(repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order:
            s, _ = C.timed(call(name), device)
            times[name].append(s)
    hf = C.median(times["HF generate"])
    rows = []
    out: dict[str, Any] = {"model": label, "prompt_tokens": len(prompt), "new_tokens": T, "repeats": repeats,
                           "variants": {}}
    for name in names:
        med = C.median(times[name])
        paired = C.median([a / b for a, b in zip(times[name], times["HF generate"])])
        mm = first_mismatch(tokens[name], tokens["HF generate"])
        same = "yes" if mm is None else f"NO (first at {mm})"
        rows.append([name, calls[name], med * 1000, med * 1000 / T, med / hf, paired, same])
        out["variants"][name] = {"forward_calls": calls[name], "median_s": med, "times_s": times[name],
                                 "ratio_vs_hf": med / hf, "paired_median_ratio": paired,
                                 "same_tokens_as_hf": mm is None, "first_mismatch": mm}
    out["table"] = C.table(f"decode overhead: {label}, prompt {len(prompt)} tokens, {T} new tokens, "
                           f"median of {repeats} interleaved repeats",
                           ["loop", "forwards", "ms", "ms/token", "x HF", "paired x HF", "same tokens"], rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    ap.add_argument("--tokens", type=int, default=64, help="new tokens on the embedded checkpoint")
    ap.add_argument("--repeats", type=int, default=31, help="timed repeats per loop on the embedded checkpoint")
    ap.add_argument("--llama-preset", default="100m", choices=sorted(C.LLAMA_PRESETS),
                    help="the random Llama's shape (100m: hidden 768, 12 layers, vocab 32000)")
    ap.add_argument("--llama-tokens", type=int, default=24, help="new tokens on the random Llama")
    ap.add_argument("--llama-prompt", type=int, default=32, help="prompt tokens (random ids) on the random Llama")
    ap.add_argument("--llama-repeats", type=int, default=5)
    ap.add_argument("--skip-llama", action="store_true")
    a = ap.parse_args(argv)
    threads_line = C.setup_torch(a.threads)

    from pytest_kvaudit.core.model.config import EMBEDDED_DIR
    from pytest_kvaudit.core.model.engine_protocol import OpenSpec
    from pytest_kvaudit.core.model.items import load_item_set
    from pytest_kvaudit.core.runtime.loading import open_model

    results: list[dict[str, Any]] = []
    h = open_model(OpenSpec(str(EMBEDDED_DIR), a.dtype, a.device))
    item = load_item_set(EMBEDDED_DIR / "items.jsonl", 1, None, None, None).items[0]
    prompt = list(h.tokenizer(item.prompt, add_special_tokens=True)["input_ids"])
    label = f"embedded ({C.n_params(h.model) / 1e6:.2f}M params, {a.dtype}, {a.device})"
    results.append(measure(label, h.model, prompt, a.tokens, a.repeats, a.device))
    del h

    if not a.skip_llama:
        model = C.random_llama(a.llama_preset, a.device, a.dtype)
        rng = random.Random(0)
        vocab = model.config.vocab_size
        prompt = [rng.randrange(2, vocab) for _ in range(a.llama_prompt)]
        label = f"random Llama {a.llama_preset} ({C.n_params(model) / 1e6:.1f}M params, {a.dtype}, {a.device})"
        results.append(measure(label, model, prompt, a.llama_tokens, a.llama_repeats, a.device))
        del model

    emb = results[0]["variants"]["kvaudit trajectory"]
    line, ok = C.target_line("embedded trajectory/generate wall ratio", emb["ratio_vs_hf"], "<=", TARGET)
    if not all(v["same_tokens_as_hf"] for r in results for v in r["variants"].values()):
        print("note: a kvaudit loop produced different tokens from generate (see 'same tokens'): "
              "its timing compares different work")
    C.write_json(a.out, {"benchmark": "decode_overhead", "threads": threads_line,
                         "environment": C.environment(a.device), "results": results,
                         "target": {"embedded_ratio_max": TARGET, "met": ok, "line": line}})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
