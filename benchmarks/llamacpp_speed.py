"""Load time, prefill and decode speed of the llama.cpp backend per K/V cache type, one thread.

    python benchmarks/llamacpp_speed.py [--model FILE.gguf]

Default model: SmolLM2-135M-Instruct Q4_1 (``pytest_kvaudit.testing.smollm2()``). Prefill is one 300-token
``llama_decode``; decode is 128 greedy steps through the audit's own decoder (what a cell's continuations run).
"""

from __future__ import annotations

import argparse
import time

from pytest_kvaudit.core.runtime.backends import open_backend
from pytest_kvaudit.core.runtime.chat import chat_prompt_ids
from pytest_kvaudit.core.runtime.decoder import Decoder, continue_greedy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtypes", default="fp32,fp16,bf16,q8_0")
    args = ap.parse_args()
    if args.model is None:
        from pytest_kvaudit.testing import smollm2

        args.model = str(smollm2()[0])
    for dt in args.dtypes.split(","):
        t = time.perf_counter()
        b = open_backend("llama.cpp", args.model, dt)
        load = time.perf_counter() - t
        dec = Decoder(b)
        p = list(chat_prompt_ids(b.tokenizer, "Tell me a long story about a dragon who learns arithmetic."))
        ids = (p * (300 // len(p) + 1))[:300]
        t = time.perf_counter()
        dec.step(ids, b.fresh())
        prefill = time.perf_counter() - t
        s = b.fresh()
        dec.step(p, s)
        t = time.perf_counter()
        suffix, _ = continue_greedy(dec, s, p[-1], 128)
        decode = time.perf_counter() - t
        print(f"{dt}: open {load:.2f} s, prefill {len(ids) / prefill:.0f} tokens/s, decode {len(suffix) / decode:.1f} "
              "tokens/s")


if __name__ == "__main__":
    main()
