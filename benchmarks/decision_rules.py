"""The decision rules' size and power, by exact enumeration, and the plan's strict n checked by a seeded
simulation (issue 37). The tests prove the bounds (``tests/claims/test_decision_rules.py``); this prints the figures
the docs quote.

    python benchmarks/decision_rules.py     # writes benchmarks/results/decision-rules.txt
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from scipy import stats

from pytest_kvaudit.claims.power import (
    matched_chances,
    matched_rule,
    rate_chances,
    units_for_equivalence,
    units_for_rate,
)
from pytest_kvaudit.claims.stats import mcnemar_p_array
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.cost.chance import items_for_count

OUT = Path(__file__).resolve().parent / "results" / "decision-rules.txt"
MARGIN = 0.06
NS = (20, 50, 100, 150, 197, 200, 300, 400)
DS = (0.06, 0.07, 0.08, 0.1, 0.12, 0.15, 0.2, 0.3, 0.5)


def simulate_pass(n: int, d: float, rng: np.random.Generator, draws: int = 20000) -> float:
    x = rng.multinomial(n, [d / 2, d / 2, 1 - d], size=draws)
    return float(matched_rule(x[:, 0], x[:, 1], n, MARGIN)[0].mean())


def main() -> int:
    out = ["Decision rules of issue 37: size and power by exact enumeration (python benchmarks/decision_rules.py)", ""]
    worst = max((float((stats.binom.pmf(np.arange(m + 1), m, 0.5)
                        * (mcnemar_p_array(np.arange(m + 1), m) < 0.05)).sum()), m) for m in range(1, 401))
    out.append(f"McNemar exact, two-sided alpha 0.05: largest conditional size over m = 1..400 discordant pairs "
               f"{worst[0]:.5f} (m = {worst[1]})")
    sizes = [(matched_chances(n, d, s * MARGIN, MARGIN)[0], n, d, s) for n in NS for d in DS for s in (1, -1)]
    top = max(sizes)
    out.append(f"matched_construction PASS (Tango within ±6 points), size at a true difference of ±6 points: largest "
               f"{top[0]:.4f} (n = {top[1]}, discordance {top[2]}) over n in {NS} and discordance in {DS}; "
               "nominal 0.025 per side")
    rate = [(max(rate_chances(n, 0.02, 0.02)), n) for n in range(20, 401)]
    out.append(f"FP32 rate rule at a true 2%: largest P(pass) or P(fail) over n = 20..400 {max(rate)[0]:.4f} "
               f"(n = {max(rate)[1]}); at a true 1% and n = 197, P(fail) = {rate_chances(197, 0.01, 0.02)[1]:.4f} "
               "(the old point-estimate rule: 0.137)")
    out += ["", "Power at SmolLM2's n and discordance (197 pairs, 25/197 = 12.7% divergent suffixes):"]
    for delta in (0.0, 0.03, 0.06):
        p, f = matched_chances(197, 25 / 197, delta, MARGIN)
        out.append(f"  true difference {delta * 100:+.0f} points: P(pass) {p:.3f}, P(fail) {f:.3f}")
    out += ["", "Strict n for an 80% chance to pass (accuracy unmoved), checked by a seeded simulation (20,000 draws):"]
    rng = np.random.default_rng(37)
    for d in (0.0, 0.02, 25 / 197, 0.2):
        n = units_for_equivalence(d, MARGIN)
        assert n is not None
        out.append(f"  discordance {d:.3f}: {n} pairs; simulated P(pass) at n {simulate_pass(n, d, rng):.3f}, at 0.9 n "
                   f"{simulate_pass(int(0.9 * n), d, rng):.3f}")
    out.append(f"  FP32 upper bound within 2% at a true 0%: {units_for_rate(0.0, 0.02)} units; at 0.5%: "
               f"{units_for_rate(0.005, 0.02)}")
    out.append(f"  10 divergent units (recurrence, donors) at 25/197 per item: {items_for_count(25 / 197, 10)} items")
    atomic_write_text(OUT, "\n".join(out) + "\n")
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
