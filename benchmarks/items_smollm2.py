"""How SmolLM2-135M-Instruct fares on a built-in item set: accuracy, extraction, eligibility, and where the
boundary falls relative to the answer, per item and in total.

Why: an item set is only worth auditing when the model's labels can move: answered right about half the
time (a model that is always wrong or always right leaves no label to change), an answer extracted from
nearly every trajectory, and a boundary that the trajectory reaches *before* its answer, so the answer
lies in the suffix that a construction may change. This measures the three on the set's own rules, through
kvaudit's own code: the set from ``builtin_item_set``, the prompt through ``chat_prompt_ids`` (the chat
template, as the audit applies it by default to a checkpoint that ships one), ``find_boundary`` and
``extract_answer`` with the set's marker and regex. The decoding is the audit's trajectory in its plainest
form: the prompt prefilled in one forward, then one greedy token per forward on the retained cache, until
EOS or the set's ``max_new_tokens``, on one thread.

    python benchmarks/items_smollm2.py --dtype fp32 [--items builtin:arith-v3] [--n 200] [--model DIR]

The model folder defaults to ``pytest_kvaudit.testing.smollm2()``'s (``KVAUDIT_CACHE=/work/cache`` finds the
converted copy). Prints one line per item, then the totals; nothing is asserted.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a checkout without an install: import the working tree
    sys.path.insert(0, str(REPO))

from pytest_kvaudit.core.itemsets.builtin_items import BUILTIN_CHAT_DEFAULT, builtin_item_set  # noqa: E402
from pytest_kvaudit.core.model.config import BoundaryRule  # noqa: E402
from pytest_kvaudit.core.model.items import find_boundary  # noqa: E402
from pytest_kvaudit.core.runtime.chat import chat_prompt_ids  # noqa: E402


def first_token_covering(gen: list[int], chars: int, decode) -> int:  # type: ignore[no-untyped-def]
    """The fewest generated tokens whose text reaches ``chars`` characters."""
    lo, hi = 1, len(gen)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(gen[:mid])) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo


def greedy(model, prompt: list[int], budget: int, eos: set[int]) -> list[int]:  # type: ignore[no-untyped-def]
    """The audit's trajectory: the prompt in one forward, then one token per forward on the retained cache."""
    import torch

    gen: list[int] = []
    with torch.no_grad():
        out = model(torch.tensor([prompt]), use_cache=True)
        while True:
            gen.append(int(out.logits[0, -1].argmax()))
            if gen[-1] in eos or len(gen) >= budget:
                return gen
            out = model(torch.tensor([[gen[-1]]]), past_key_values=out.past_key_values, use_cache=True)


def greedy_batch(model, prompts: list[list[int]], budget: int, eos: set[int],  # type: ignore[no-untyped-def]
                 pad: int) -> list[list[int]]:
    """The same greedy decoding for a left-padded batch (``generate``), each row cut after its first EOS: many
    times faster on a loaded CPU, but the batch's shapes and padding may move a near-tie, so its figures are
    an estimate of the single-sequence ones (``--batch 1``), which the results compare on the items both ran."""
    import torch

    width = max(map(len, prompts))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=budget, do_sample=False,
                             eos_token_id=sorted(eos), pad_token_id=pad)
    rows = []
    for row in out[:, width:].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        rows.append(row[:cut])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    ap.add_argument("--items", default=BUILTIN_CHAT_DEFAULT)
    ap.add_argument("--n", type=int, default=None, help="the first N items (default: the set's size)")
    ap.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2 from testing.smollm2())")
    ap.add_argument("--max-new-tokens", type=int, default=None, help="default: the set's")
    ap.add_argument("--batch", type=int, default=1, help="items per forward: 1 is the audit's own decoding (default); "
                    "more is a left-padded batch, faster and an estimate")
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    if a.model is None:
        from pytest_kvaudit.testing import smollm2

        a.model = str(smollm2()[1])
    iset = builtin_item_set(a.n, a.items)
    budget = a.max_new_tokens or iset.max_new_tokens
    tok = AutoTokenizer.from_pretrained(a.model)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, attn_implementation="sdpa").eval()
    cfg_eos = getattr(model.generation_config, "eos_token_id", None)
    eos = {tok.eos_token_id} | set(cfg_eos if isinstance(cfg_eos, list) else [cfg_eos] if cfg_eos is not None else [])
    rule = BoundaryRule.parse(iset.boundary)
    regex = re.compile(iset.answer_regex)

    def decode(ids: list[int]) -> str:
        return str(tok.decode(ids, skip_special_tokens=False))

    print(f"model {a.model}, {a.items} ({len(iset.items)} items), {a.dtype}, boundary {rule.describe()}, "
          f"max_new_tokens {budget}, torch {torch.__version__}, 1 thread, greedy, chat template, "
          + ("one item per forward" if a.batch == 1 else f"left-padded batches of {a.batch} (an estimate)"))
    print("id gold extracted correct boundary_tok answer_tok generated eos")
    rows = []
    t0 = time.perf_counter()
    prompts = [list(chat_prompt_ids(tok, it.prompt or "", a.model)) for it in iset.items]
    if a.batch == 1:
        generations = [greedy(model, p, budget, eos) for p in prompts]
    else:
        generations = []
        for i in range(0, len(prompts), a.batch):
            generations += greedy_batch(model, prompts[i:i + a.batch], budget, eos, tok.pad_token_id or 0)
    for it, gen in zip(iset.items, generations):
        text = decode(gen)
        m = regex.search(text)
        got = m.group(1).strip() if m else None
        answer_tok = first_token_covering(gen, m.end(1), decode) if m else None
        boundary = find_boundary(gen, rule, lambda g: decode(list(g)))
        rows.append((it, got, boundary, answer_tok, len(gen), gen[-1] in eos))
        print(it.id, it.answer, got, got == it.answer, boundary, answer_tok, len(gen), gen[-1] in eos, repr(text[:90]),
              flush=True)
    seconds = time.perf_counter() - t0

    n = len(rows)
    correct = sum(got == it.answer for it, got, *_ in rows)
    extracted = sum(got is not None for _, got, *_ in rows)
    eligible = [r for r in rows if r[2] is not None]
    before = [r for r in eligible if r[3] is not None and r[2] < r[3]]  # boundary strictly before the answer's end
    gaps = [r[3] - r[2] for r in before]
    by_kind: dict[str, list[bool]] = defaultdict(list)
    for it, got, *_ in rows:
        by_kind[it.id.rsplit("-", 1)[1]].append(got == it.answer)
    print(f"accuracy {correct}/{n} = {correct / n:.1%}  ("
          + ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in by_kind.items())
          + ")")
    print(f"answers extracted {extracted}/{n} = {extracted / n:.1%}")
    print(f"eligible (boundary reached) {len(eligible)}/{n} = {len(eligible) / n:.1%}")
    print(f"boundary before the first answer {len(before)}/{len(eligible)} eligible; tokens from the boundary to the "
          f"answer's end: mean {statistics.mean(gaps) if gaps else 0:.1f}, median "
          f"{statistics.median(gaps) if gaps else 0}, min {min(gaps, default=0)}, max {max(gaps, default=0)}")
    print(f"generated tokens per trajectory: mean {statistics.mean(r[4] for r in rows):.1f} (EOS on "
          f"{sum(r[5] for r in rows)}/{n}, the rest stop at {budget}); first answer ends at token mean "
          f"{statistics.mean(r[3] for r in rows if r[3]) if extracted else 0:.1f}, max "
          f"{max((r[3] for r in rows if r[3]), default=0)}")
    print(f"{seconds:.0f}s ({seconds / max(1, sum(r[4] for r in rows)) * 1e3:.1f} ms per generated token)")


if __name__ == "__main__":
    main()
