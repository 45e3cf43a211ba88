"""An engine's read of a prompt's K/V against transformers' forward of the same ids, as figures
(:mod:`pytest_kvaudit.oracle`; the tests hold the same checks on the embedded checkpoint).

Usage: python scripts/oracle_read.py CHECKPOINT [vllm|transformers] [PROMPT_LENGTH]   (default: vllm, 77 ids)
Prints, per precision (fp32, bf16): the largest difference relative to each layer's largest value, and how many
rows (over every layer, K and V) are nearer another position than their own. vLLM runs in its own venv.
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

from pytest_kvaudit.core.model.precisions import named
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.core.runtime.backends import open_backend
from pytest_kvaudit.oracle import check_read, reference_kv


def read(backend: object, engine: str, ids: list[int]) -> list[tuple[object, object]]:
    if engine == "vllm":
        backend.reset()  # type: ignore[attr-defined]
        done = backend.run([(ids, 1, ())])[0]  # type: ignore[attr-defined]
        state = backend.read(done.blocks, len(ids))  # type: ignore[attr-defined]
        return [state.kv(i) for i in range(len(state.layers))]
    cache = backend.fresh()  # type: ignore[attr-defined]
    backend.step(ids, cache)  # type: ignore[attr-defined]
    return kv.layer_kv(cache)


if __name__ == "__main__":
    ckpt, engine = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "vllm"
    length = int(sys.argv[3]) if len(sys.argv) > 3 else 77
    for dtype in ("fp32", "bf16"):
        backend = open_backend(engine, ckpt, dtype)
        model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=getattr(torch, str(named(dtype).torch))).eval()
        gen = torch.Generator().manual_seed(0)
        ids = [int(t) for t in torch.randint(2, int(model.config.vocab_size), (length,), generator=gen)]
        check = check_read(read(backend, engine, ids), reference_kv(model, ids))
        worst = max(check.checks, key=lambda c: c.rel)
        print(f"{engine} {dtype} {length} ids: max relative error {check.max_rel:.3g} (layer {worst.layer} "
              f"{worst.side.upper()}), {check.misplaced} of {len(check.checks) * length} rows nearest "
              "another position")
        del backend
