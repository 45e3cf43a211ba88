"""The stop rule as a lever: the same audit with every suffix decoded to its budget, and stopped at the item
set's first answer (``builtin:arith-v3``'s ``stop_regex``), in one run.

Why: after answering, a small instruct model goes on inventing questions and answering them; every
construction of every unit decoded those tokens, though no label or answer reads them. The script runs the
whole store (every built-in claim's work) on the first ``--n`` items twice, ``--kvaudit-stop-regex=off``
first, then the set's own stop, in the same process and on the same items, and prints:

* forward calls, forward tokens and seconds of each, and the ratio stopped / whole;
* per unit and construction, whether the label and the answer read from the stopped suffix are the ones the
  whole suffix gives (they must be: the rule stops after the first answer), and whether the stopped suffix
  is the whole one cut short (it must be: the same decoding);
* how many units diverge (live vs prefill) in each: a divergence after the first answer is no longer seen.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C


def audit(cfg: Any) -> tuple[Any, float]:
    from pytest_kvaudit.core.compute.store import Store

    t0 = time.perf_counter()
    store = Store.open(cfg)
    store.compute()
    return store, time.perf_counter() - t0


def conts(rec: Any) -> dict[str, Any]:
    return {**rec.constructions, **{f"fixed:{k}": c for k, c in rec.fixed.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = C.parser(__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint folder (default: SmolLM2-135M-Instruct, fetched once)")
    ap.add_argument("--items", default="builtin:arith-v3")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--dtypes", default="bf16,fp32")
    a = ap.parse_args(argv)
    threads_line = C.setup_torch(a.threads)

    from pytest_kvaudit.core.model.config import AuditConfig, parse_dtypes

    if a.model is None:
        from pytest_kvaudit.testing import smollm2

        a.model = str(smollm2()[1])
    base = AuditConfig(model=a.model, items=a.items, n=a.n, dtypes=parse_dtypes(a.dtypes), device=a.device,
                       threads=a.threads)
    whole, t_whole = audit(base.replace(stop_regex="off"))
    stopped, t_stop = audit(base)
    rows, same_label, same_answer, cut_short, units = [], 0, 0, 0, 0
    for key, rec in stopped.records.items():
        full = whole.records[key]
        for name, c in conts(rec).items():
            f = conts(full).get(name)
            if f is None or not c.logits_fp:
                continue
            units += 1
            same_label += c.label == f.label
            same_answer += c.answer == f.answer
            cut_short += f.suffix[: len(c.suffix)] == c.suffix
    div = {s: sum(r.eligible and r.constructions["live"].suffix != r.constructions["prefill"].suffix
                  for r in st.records.values()) for s, st in (("whole", whole), ("stopped", stopped))}
    for label, st, t in (("whole budget (--kvaudit-stop-regex=off)", whole, t_whole),
                         ("stopped at the first answer", stopped, t_stop)):
        rows.append([label, st.cost.forward_calls, st.cost.forward_tokens, t,
                     div["whole" if st is whole else "stopped"]])
    rows.append(["stopped / whole", stopped.cost.forward_calls / whole.cost.forward_calls,
                 stopped.cost.forward_tokens / whole.cost.forward_tokens, t_stop / t_whole, "-"])
    C.table(f"{a.items} x {a.n} items, {a.dtypes}, {Path(a.model).name}, every built-in claim's work",
                  ["run", "forward calls", "forward tokens", "seconds", "live vs prefill divergent"], rows)
    checks = [["label as the whole suffix reads it", same_label, units],
              ["answer as the whole suffix reads it", same_answer, units],
              ["stopped suffix = the whole one cut short", cut_short, units]]
    C.table("what the stop keeps (per unit and construction)", ["check", "yes", "of"], checks)
    C.write_json(a.out, {"threads": threads_line, "environment": C.environment(a.device), "model": a.model, "n": a.n,
                         "rows": rows, "checks": checks, "divergent": div, "stop_regex": stopped.item_set.stop_regex})
    return 0 if same_label == same_answer == cut_short == units else 1


if __name__ == "__main__":
    sys.exit(main())
