"""Does transformers' prefix block sharing change what continuous batching generates? The same requests served by
``model.generate_batch`` (greedy) with ``ContinuousBatchingConfig(allow_block_sharing=...)`` on and off, compared
token for token, in two workloads where sharing hits:

- ``system``: N questions behind one long system prompt (every request shares its first pages);
- ``turns``: N two-turn chats on one persistent manager: the first turns are served, then the second turns (the
  first turn, one fixed answer and a new question) on the same manager, so a second turn hits the pages its
  first turn left cached. The answers in the second turns' prompts are the same for both settings (those of the
  sharing-off run), so only sharing differs.

The token budget per step (``max_batch_tokens``) is small, so requests are admitted over several steps and later
ones hit pages earlier ones wrote (requests scheduled in the same step never hit each other).

    python benchmarks/cb_sharing.py MODEL_DIR [N] [OUT.json]     # BF16 and FP32; prints one line per workload

BF16 bits depend on the CPU: the machine's name and the date are printed with the figures.
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from typing import Any

SYSTEM = ("You are a careful arithmetic tutor. Work through every question step by step, show each partial sum on "
          "its own line, check the result once more by adding the numbers in the opposite order, and finish with "
          "the words 'Answer:' followed by the final number. Never skip a step and never guess.")


def questions(n: int) -> list[str]:
    return [f"What is {17 + 7 * i} plus {29 + 11 * i} plus {3 + 5 * i}?" for i in range(n)]


def serve(model: Any, prompts: list[list[int]], sharing: bool, new: int, page: int,
          keep: bool = False) -> list[list[int]]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, max_new_tokens=new, eos_token_id=model.generation_config.eos_token_id,
                           pad_token_id=0)
    cbc = ContinuousBatchingConfig(page_size=page, num_blocks=1024, max_batch_tokens=256, allow_block_sharing=sharing,
                                   use_cuda_graph=False, auto_switch_to_flash=False)
    out = model.generate_batch(prompts, generation_config=gen, continuous_batching_config=cbc, warmup=False,
                               persistent_manager=keep)
    return [list(r.generated_tokens) for r in out.values()]


def chat(tok: Any, turns: list[tuple[str, str]], question: str) -> list[int]:
    msgs = [{"role": "system", "content": SYSTEM}]
    for q, a in turns:
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    msgs.append({"role": "user", "content": question})
    return list(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))


def workloads(model: Any, tok: Any, n: int, sharing: bool, new: int, page: int,
              answers: list[str]) -> dict[str, list[list[int]]]:
    qs = questions(2 * n)
    first = [chat(tok, [], q) for q in qs[:n]]
    system = serve(model, first, sharing, new, page)
    second = [chat(tok, [(q, a)], q2) for q, a, q2 in zip(qs[:n], answers or [""] * n, qs[n:])]
    serve(model, first, sharing, new, page, keep=True)  # the first turns, their pages left cached
    turns = serve(model, second, sharing, new, page, keep=False)  # the same manager: second turns hit them
    model.destroy_cached_continuous_batching_manager()
    return {"system": system, "turns": turns}


def main() -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 32
    new, page = 48, 16
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    name = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    result: dict[str, Any] = {"machine": name, "date": datetime.date.today().isoformat(), "n": n, "new_tokens": new,
                              "page_size": page, "python": platform.python_version()}
    tok = AutoTokenizer.from_pretrained(path)
    for dtype in ("bf16", "fp32"):
        torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype, attn_implementation="sdpa")
        first = [chat(tok, [], q) for q in questions(n)]
        answers = [tok.decode(a, skip_special_tokens=True) for a in serve(model, first, False, new, page)]
        off = workloads(model, tok, n, False, new, page, answers)
        on = workloads(model, tok, n, True, new, page, answers)
        for w in ("system", "turns"):
            changed = sum(a != b for a, b in zip(on[w], off[w]))
            result[f"{dtype}_{w}"] = [changed, n]
            print(f"{dtype} {w}: sharing on vs off changed {changed}/{n} outputs ({name}, {result['date']})",
                  flush=True)
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
