"""A run against its baseline (``--kvaudit-baseline``): the report's ``baseline`` block and its terminal lines.

Verdicts are compared claim by claim (a claim whose baseline verdict was about a ledger's presence, not the
checkpoint, is left out), and the ``kvaudit::baseline`` test's ledger comparison (divergent sets, label
changes, trajectories token for token) is carried in as it came. Each movement is a regression, an improvement
or a change under the run's rules (:class:`pytest_kvaudit.core.gate.rules.Rules`). Pure functions, no pytest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvaudit.claims import base
from pytest_kvaudit.claims.stats import wilson_interval
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.gate.rules import Rules
from pytest_kvaudit.report.document import display_of, ordered

#: how many items a line names before "and N more"
NAMED = 6


def load_baseline(path: Path) -> dict[str, Any]:
    """A recorded report: a report JSON file, or a snapshots/<slug>/ folder holding report.json."""
    p = path / "report.json" if path.is_dir() else path
    if not p.is_file():
        raise KvauditError(f"--kvaudit-baseline: no report at {p}: record one with --snapshot-update or "
                           "--kvaudit-report")
    try:
        rep = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KvauditError(f"--kvaudit-baseline: {p} is not valid JSON ({exc}): truncated?") from None
    if not isinstance(rep, dict) or not isinstance(rep.get("claims"), dict):
        raise KvauditError(f"--kvaudit-baseline: {p} is not a kvaudit report (no 'claims' block)")
    return rep


def comparable(report: Mapping[str, Any], name: str) -> bool:
    """Whether claim ``name``'s verdict in ``report`` speaks for the checkpoint (its display says; a report
    written before displays said so asks the registered claim)."""
    shown = display_of(report, name)
    if "comparable" in shown:
        return bool(shown["comparable"])

    if name in {c.name for c in base.registered()}:
        return base.get(name).comparable(base.ClaimResult.from_dict(report["claims"][name]))
    return True


def _side(c: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if c is None else {"status": c["status"], "n": c["n"], "k": c["k"]}


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any], rules: Rules,
            ledger: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report's ``baseline`` block: per claim both verdicts side by side, the changes, and the ledger
    comparison that ``kvaudit::baseline`` made (absent when that test did not run)."""
    changes: list[dict[str, Any]] = []
    claims: dict[str, dict[str, Any]] = {}
    for name in ordered(current):
        c, b = current["claims"][name], baseline["claims"].get(name)
        row = claims[name] = {"was": _side(b), "now": _side(c), "kind": None}
        if b is None:
            row["kind"] = "new"
            changes.append({"claim": name, "kind": "new", "now": c["status"]})
            continue
        if not (comparable(baseline, name) and comparable(current, name)):
            row["kind"] = "not_compared"  # a ledger recorded, or none to audit: not the checkpoint's doing
            continue
        kind = rules.verdict(b["status"], c["status"])
        if kind is not None:
            row["kind"] = kind
            changes.append({"claim": name, "kind": "verdict" if kind == "change" else kind, "was": b["status"],
                            "now": c["status"]})
        old = {k: tuple(v) for k, v in display_of(baseline, name).get("rates", {}).items()}
        for key, (k, n) in display_of(current, name).get("rates", {}).items():
            if key not in old or n == 0 or old[key][1] == 0:
                continue
            lo, hi = wilson_interval(*old[key])
            if not lo <= k / n <= hi:  # reported; whether it fails the gate is the rules' call, on the ledgers
                changes.append({"claim": name, "kind": "rate", "figure": key, "was": list(old[key]),
                                "now": [k, n], "baseline_interval": [lo, hi]})
    for name in sorted(set(baseline["claims"]) - set(current["claims"])):
        claims[name] = {"was": _side(baseline["claims"][name]), "now": None, "kind": "missing"}
        changes.append({"claim": name, "kind": "missing", "was": baseline["claims"][name]["status"]})
    found = list((ledger or {}).get("findings", []))
    kinds = [c["kind"] for c in changes] + [f["kind"] for f in found]
    out: dict[str, Any] = {"model_was": baseline.get("model", {}).get("weights_digest"), "rules": rules.text(),
                           "changes": changes, "claims": claims, "regressions": kinds.count("regression"),
                           "improvements": kinds.count("improvement")}
    if ledger is not None:
        out["ledger"] = dict(ledger)
    return out


# -- lines ----------------------------------------------------------------------------------------
def _names(xs: list[str]) -> str:
    return " ".join(xs[:NAMED]) + (f" and {len(xs) - NAMED} more" if len(xs) > NAMED else "")


def _tag(kind: str) -> str:
    return {"regression": "REGRESSION ", "improvement": "improvement "}.get(kind, "")


def ledger_lines(ledger: Mapping[str, Any], diff_marks: bool = False) -> list[str]:
    """Per precision: divergent suffixes and label changes, baseline -> this run, with the items that left and
    joined each set; the trajectories that moved, each with its first differing token."""
    found = {(f["metric"], f["dtype"]): f["kind"] for f in ledger.get("findings", [])}
    out = []
    for d, p in ledger.get("precisions", {}).items():
        for metric, what in (("divergence", "divergent suffixes (live vs prefill)"), ("labels", "label changes")):
            m = p[metric]
            kind = found.get((metric, d))
            moved = " (the set changed)" if (m["left"] or m["joined"]) and m["was"][0] == m["now"][0] else ""
            out.append(f"{_tag(kind or '')}{d} {what}: {m['was'][0]}/{m['was'][1]} -> {m['now'][0]}/{m['now'][1]}"
                       f"{moved}")
            if m["left"]:
                out.append(f"  {'-' if diff_marks else 'left:  '} {_names(m['left'])}")
            if m["joined"]:
                out.append(f"  {'+' if diff_marks else 'joined:'} {_names(m['joined'])}")
        t = p["trajectories"]
        kind = found.get(("trajectories", d))
        out.append(f"{_tag(kind or '')}{d} trajectories: {t['changed']}/{t['compared']} changed token for token")
        for it in t["items"][:NAMED]:
            if it["position"] is None:
                out.append(f"  {it['item']}@{d}: {it.get('why', 'prompt ids differ')}")
            else:
                out += _change(f"{it['item']}@{d}", it, diff_marks)
        if len(t["items"]) > NAMED:
            out.append(f"  and {t['changed'] - NAMED} more in the JSON report")
        conts = t.get("continuations", [])
        if conts:
            ckind = found.get(("continuations", d))
            out.append(f"{_tag(ckind or '')}{d} continuations: {t.get('continuations_changed', len(conts))} changed "
                       "token for token where the trajectory held")
            for it in conts[:NAMED]:
                out += _change(f"{it['item']}@{d} {it['construction']}", it, diff_marks)
            if len(conts) > NAMED:
                out.append(f"  and {t.get('continuations_changed', len(conts)) - NAMED} more in the JSON report")
    if ledger.get("environment"):
        out.append("note: recorded in another environment (" + "; ".join(ledger["environment"][:3])
                   + "): bits, and with them trajectories, may move without the checkpoint")
    return out


def _tok(x: Any) -> str:
    return "(end)" if x is None else str(x)


def _change(where: str, it: Mapping[str, Any], diff_marks: bool) -> list[str]:
    """One moved token sequence: the first differing token's ids, then each side's text around it with its ids
    beside it (where the run's tokenizer decoded them)."""
    head = f"  {where} from token {it['position']}: baseline id {_tok(it['was'])}, this run id {_tok(it['now'])}"
    if "was_text" not in it:
        return [head]
    was, now = ("-", "+") if diff_marks else ("baseline:", "this run:")
    return [head, f"    {was} {it['was_text']!r} (ids {' '.join(map(str, it.get('was_ids', [])))})",
            f"    {now} {it['now_text']!r} (ids {' '.join(map(str, it.get('now_ids', [])))})"]


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' * (n != 1)}"


def compare_lines(cmp: Mapping[str, Any]) -> list[str]:
    """The terminal's "changes from the baseline" section."""
    out = [f"Rules {cmp.get('rules', '-')}: {_count(cmp.get('regressions', 0), 'regression')} and "
           f"{_count(cmp.get('improvements', 0), 'improvement')}."]
    for ch in cmp["changes"]:
        if ch["kind"] == "rate":
            (k0, n0), (k1, n1) = ch["was"], ch["now"]
            lo, hi = ch["baseline_interval"]
            out.append(f"{ch['claim']}: {ch['figure']} moved {k0}/{n0} -> {k1}/{n1}, outside the baseline's 95% "
                       f"interval [{lo:.3f}, {hi:.3f}]")
        elif ch["kind"] == "new":
            out.append(f"{ch['claim']}: new claim, {ch['now']}")
        elif ch["kind"] == "missing":
            out.append(f"{ch['claim']}: in the baseline ({ch['was']}), not judged in this run")
        else:
            out.append(f"{_tag(ch['kind'])}{ch['claim']}: {ch['was']} -> {ch['now']}")
    if "ledger" in cmp:
        out += ledger_lines(cmp["ledger"])
    else:
        out.append("Trajectories were not compared, because the kvaudit::baseline test did not run.")
    if not cmp["changes"] and not (cmp.get("ledger") or {}).get("findings") and "ledger" in cmp:
        out.append("No change from the baseline.")
    return out


def gate_diff(ledger: Mapping[str, Any], path: str) -> list[str]:
    """The failed ``kvaudit::baseline`` test's message, shaped like syrupy's snapshot diff."""
    n = sum(f["kind"] == "regression" for f in ledger.get("findings", []))
    w = ledger.get("weights_digest", {})
    return [f"{n} regression{'s' * (n != 1)} from the baseline {path} (--kvaudit-baseline-fail={ledger.get('rules')})",
            f"- baseline  weights {str(w.get('baseline'))[:23]}",
            f"+ this run  weights {str(w.get('run'))[:23]}",
            *ledger_lines(ledger, diff_marks=True)]
