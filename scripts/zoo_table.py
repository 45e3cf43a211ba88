"""Run the built-in claims on every zoo family's tiny random checkpoint and print a markdown table.

    python scripts/zoo_table.py [FAMILY ...]

One row per family: its layer kinds (from the config), the six verdicts (or the error or refusal that
ended the run), the seconds it took, and whether the FP32 live and prefill boundary states differ bit for
bit, per layer kind (from the report's anatomy drift). Each family runs as a user's ``pytest
--kvaudit-model=CKPT`` would, in its own directory and process, with the zoo's few items (see
``tests/core/runtime/zoo.ini``), so a row costs seconds and one family's crash is only its row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_kvaudit.testing import ZOO, ZOO_ITEMS, ZOO_MAX_NEW_TOKENS, layer_kinds, tiny_checkpoint

CLAIMS = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "ledger_audit",
          "donor_following")
SHORT = {"pass": "pass", "fail": "FAIL", "inconclusive": "inc"}


def run_family(family: str, work: Path) -> dict[str, Any]:
    """Build ``family``'s checkpoint under ``work``, run the claims on it; what the row needs."""
    import transformers

    ck = tiny_checkpoint(work / "ck", family, n_items=ZOO_ITEMS, max_new_tokens=ZOO_MAX_NEW_TOKENS, zoo=True)
    kinds = layer_kinds(transformers.AutoConfig.from_pretrained(str(ck)))
    run_dir = work / "run"
    run_dir.mkdir()
    zoo_ini = Path(__file__).resolve().parents[1] / "tests" / "core" / "runtime" / "zoo.ini"
    (run_dir / "pytest.ini").write_text(zoo_ini.read_text())
    report = run_dir / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", f"--kvaudit-model={ck}", f"--kvaudit-n={ZOO_ITEMS}",
                           f"--kvaudit-report={report}", "-p", "no:cacheprovider", "-W", "ignore", "-q"],
                          cwd=run_dir, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - t0
    data = json.loads(report.read_text()) if report.exists() else {}
    return {"family": family, "kinds": kinds, "seconds": seconds, "claims": data.get("claims", {}),
            "anatomy": data.get("analyses", {}).get("anatomy", {}), "error": first_error(proc.stdout),
            "items": data.get("items", {})}


def first_error(out: str) -> str:
    """The first line saying why a test errored or the run was refused, for the table."""
    for pattern in (r"^E\s+(\S.*)$", r"^ERROR .* - (.*)$"):
        m = re.search(pattern, out, re.M)
        if m:
            return m.group(1).strip()[:110]
    return ""


def verdicts(row: dict[str, Any]) -> list[str]:
    claims = row["claims"]
    return [SHORT.get(claims[c]["status"], claims[c]["status"]) if c in claims else "-" for c in CLAIMS]


def fp32_states(row: dict[str, Any]) -> str:
    """Whether the FP32 live and prefill states differ bit for bit, naming each differing layer's kind."""
    drift = row["anatomy"].get("drift", {}).get("fp32")
    if not drift:
        return "-"
    kinds = row["kinds"]
    moved = [(d["layer"], max(d["keys_max_abs"], d["values_max_abs"])) for d in drift]
    differ = [f"L{i} {kinds[i] if i < len(kinds) else '?'} {m:.1e}" for i, m in moved if m > 0]
    return "differ: " + ", ".join(differ) if differ else "identical"


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = ["family", "layer kinds", "eligible", *CLAIMS, "s", "fp32 live vs prefill state"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = verdicts(r)
        if r["error"] and not r["claims"] or any(c == "-" for c in cells):
            cells = [f"error: {r['error']}"] + [""] * (len(CLAIMS) - 1)
        items = r["items"]
        eligible = f"{items['eligible']}/{items['total']}" if items else "-"
        lines.append("| " + " | ".join([r["family"], " · ".join(r["kinds"]), eligible, *cells, f"{r['seconds']:.1f}",
                                        fp32_states(r)]) + " |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*", help=f"default: all {len(ZOO)}")
    args = parser.parse_args(argv)
    unknown = [f for f in args.families if f not in ZOO]
    if unknown:
        parser.error(f"unknown families {unknown}; the zoo has {', '.join(ZOO)}")
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.families or list(ZOO):
            work = Path(tmp) / family
            work.mkdir()
            rows.append(run_family(family, work))
            print(f"{family}: {rows[-1]['seconds']:.1f}s", file=sys.stderr, flush=True)
    print("\n".join(table(rows)))
    print(f"\n{len(rows)} families in {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
