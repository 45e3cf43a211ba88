"""Every decision rule's size at every n, by exact enumeration, with the chances the docs quote (issue 45).

Each verdict's size is the exact chance of that verdict at the edge of its null, maximised over a 0.01 grid of
true discordances (matched_construction: from the margin, where every discordant pair goes one way, to 1) or
rates (the rate rules), at every n from the least evidence up to 1,000 (the built-in generator's maximum)
(:mod:`pytest_kvaudit.claims.sizes`). FAIL is judged at alpha split over a claim's verdicts (1 to 4 precisions),
so each split is listed. The tests hold every n up to 400 and the worst n found here beyond it
(``tests/claims/test_decision_rules.py`` reads them from this file's output).

    nice python benchmarks/decision_rules.py     # minutes; writes benchmarks/results/decision-rules.txt
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from pytest_kvaudit.claims import rules
from pytest_kvaudit.claims.power import matched_chances, matched_rule, units_for_equivalence, units_for_rate
from pytest_kvaudit.claims.rules import RULES_VERSION, TANGO_Z, one_sided_alpha
from pytest_kvaudit.claims.sizes import discordances, matched_sizes, rate_sizes, wilson_pass_sizes
from pytest_kvaudit.core.atomic import atomic_write_text

OUT = Path(__file__).resolve().parent / "results" / "decision-rules.txt"
MARGIN, CONF, TOP, SPLITS = 0.06, 0.95, 1000, (1, 2, 3, 4)
ALPHA = round(one_sided_alpha(CONF), 6)
RATES = {"fixed_prefix_2x2 FP32 (2%)": 0.02, "lossy_cache_budget (10%)": 0.10}
SMOL = (197, 4 / 197, 25 / 197)  # SmolLM2's bf16 pairs, label discordance (4:0) and divergent-suffix rate (25)


def worst_line(name: str, sizes: np.ndarray, ns: np.ndarray, alpha: float, ds: np.ndarray | None = None) -> str:
    """The largest size over every n (and discordance), with where it is, against its alpha."""
    i = np.unravel_index(int(np.argmax(sizes)), sizes.shape)
    where = f"n = {ns[i[-1]]}" + (f", discordance {ds[i[0]]:.2f}" if ds is not None else "")
    return (f"  {name:<34} largest {sizes.max():.5f} at {where}; alpha {alpha:.5f}: "
            + ("holds" if sizes.max() <= alpha else "EXCEEDS"))


def simulate_pass(n: int, d: float, rng: np.random.Generator, draws: int = 20000) -> float:
    x = rng.multinomial(n, [d / 2, d / 2, 1 - d], size=draws)
    return float(matched_rule(x[:, 0], x[:, 1], n, MARGIN)[0].mean())


def nominal(ns: np.ndarray) -> dict[str, np.ndarray]:
    """matched_construction's sizes had Tango's z been the nominal 1.96 on both sides: why it is calibrated."""
    saved = dict(TANGO_Z)
    z = 1.959963984540054
    TANGO_Z.update({("pass", MARGIN, ALPHA): z, ("fail", MARGIN, ALPHA): z})
    try:
        return matched_sizes(ns, MARGIN, CONF, (1,))
    finally:
        TANGO_Z.clear()
        TANGO_Z.update(saved)


def main() -> int:
    start = time.time()
    out = [f"Decision rules (rules_version {RULES_VERSION}): each verdict's size by exact enumeration at every n "
           f"(nice python benchmarks/decision_rules.py)", "",
           f"alpha = {ALPHA:g} per verdict (one end of a two-sided {CONF:.0%} interval); FAIL/P is FAIL at alpha / P, "
           "P the claim's verdicts of that rule (its precisions), so the claim's FAIL size stays at most alpha.", ""]
    ns_m = np.arange(rules.PROVEN_FROM, TOP + 1)
    ds = discordances(MARGIN)
    mc = matched_sizes(ns_m, MARGIN, CONF, SPLITS)
    zs = ", ".join(f"{k[0]} alpha {k[2]:g}: z = {v}" for k, v in TANGO_Z.items() if k[1] == MARGIN)
    out += [f"matched_construction (margin {MARGIN}), n = {rules.PROVEN_FROM}..{TOP}, true difference ±{MARGIN} "
            f"(symmetric), discordance {ds[0]:.2f}..{ds[-1]:.2f} in steps of 0.01; Tango's z calibrated ({zs}):",
            worst_line("PASS", mc["pass"], ns_m, ALPHA, ds),
            *(worst_line(f"FAIL/{p}", mc[f"fail/{p}"], ns_m, ALPHA / p, ds) for p in SPLITS)]
    nom = nominal(ns_m)
    out += ["  at the nominal z = 1.96 (why it is calibrated):",
            worst_line("PASS at z = 1.96", nom["pass"], ns_m, ALPHA, ds),
            worst_line("FAIL/1 at z = 1.96", nom["fail/1"], ns_m, ALPHA, ds), ""]
    ns_r = np.arange(1, TOP + 1)
    rate = {name: rate_sizes(ns_r, thr, CONF, SPLITS) for name, thr in RATES.items()}
    for name, thr in RATES.items():
        wil = wilson_pass_sizes(ns_r, thr, CONF)
        out += [f"{name}: Clopper-Pearson both sides, n = 1..{TOP}, true rates on the 0.01 grid and the threshold:",
                worst_line("PASS", rate[name]["pass"], ns_r, ALPHA),
                *(worst_line(f"FAIL/{p}", rate[name][f"fail/{p}"], ns_r, ALPHA / p) for p in SPLITS),
                worst_line("Wilson PASS (the paper's figure)", wil, ns_r, ALPHA), ""]
    n, obs, div = SMOL
    out += [f"Chances at SmolLM2's bf16 n ({n} pairs), accuracy unmoved, at a named discordance:",
            f"  observed label discordance {obs:.3f} (4:0): P(pass) {matched_chances(n, obs, 0.0, MARGIN)[0]:.3f}",
            f"  observed divergent-suffix rate {div:.3f} (the plan's calibrated discordance): P(pass) "
            f"{matched_chances(n, div, 0.0, MARGIN)[0]:.3f}",
            f"  a true move of 12 points at discordance {div:.3f}: P(fail) "
            f"{matched_chances(n, div, 0.12, MARGIN, CONF, 2)[1]:.3f} (FAIL/2, two precisions)", "",
            f"Strict n: the least n whose chance to pass, accuracy unmoved, is at least 80% and stays so up to {TOP} "
            "(a scan), checked by a seeded simulation (20,000 draws):"]
    rng = np.random.default_rng(45)
    for d in (0.0, 0.02, div, 0.2):
        k = units_for_equivalence(d, MARGIN)
        out.append(f"  discordance {d:.3f}: " + ("none up to 1,000" if k is None else
                   f"{k} pairs; simulated P(pass) at n {simulate_pass(k, d, rng):.3f}, at 0.9 n "
                   f"{simulate_pass(int(0.9 * k), d, rng):.3f}"))
    out += [f"  FP32 upper bound within 2% at a true 0%: {units_for_rate(0.0, 0.02)} units; at 0.5%: "
            f"{units_for_rate(0.005, 0.02)}", "",
            "Every n: the largest size over the grid (matched: over discordances; rates: over true rates)",
            "n     mc:PASS  FAIL/1  FAIL/2  FAIL/3  FAIL/4 | fp32:PASS FAIL/1 FAIL/2 FAIL/3 FAIL/4 | "
            "lossy:PASS FAIL/1 FAIL/2 FAIL/3 FAIL/4"]
    cols = ["pass", *(f"fail/{p}" for p in SPLITS)]
    for i, n in enumerate(ns_r):
        j = n - rules.PROVEN_FROM
        m = "  ".join(f"{mc[c][:, j].max():.5f}" for c in cols) if j >= 0 else "  ".join(["   -   "] * 5)
        r = [" ".join(f"{rate[name][c][i]:.5f}" for c in cols) for name in RATES]
        out.append(f"{n:<5} {m} | {r[0]} | {r[1]}")
    out.insert(1, f"(enumerated in {time.time() - start:.0f} s)")
    atomic_write_text(OUT, "\n".join(out) + "\n")
    print("\n".join(out[:60]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
