"""The JSON report (DESIGN.md's schema), pure: built from verdicts and the run's data, compared with a
baseline. No claim is named here: each claim's order, key figure and watched rates come in the report's
``display`` block, written by the claim itself (or, for an older report, looked up in the registry)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_kvaudit.claims import base
from pytest_kvaudit.claims.base import USER_ORDER, ClaimResult, finite
from pytest_kvaudit.claims.rules import RULES_VERSION
from pytest_kvaudit.core.atomic import atomic_write_text

if TYPE_CHECKING:  # claims (and scipy with them) load only where a report is built
    from pytest_kvaudit.claims.base import ClaimResult

SCHEMA_VERSION = 1


def items_block(records: Iterable[Any], item_ids: Iterable[str]) -> dict[str, Any]:
    """An item is eligible when it is eligible at every precision; else counted under its first reason."""
    by_item: dict[str, list[Any]] = {}
    for r in records:
        by_item.setdefault(r.item_id, []).append(r)
    ids = list(item_ids)
    inel: dict[str, int] = {}
    listed: list[dict[str, Any]] = []  # each ineligible (item, precision) with its reason
    missing = 0
    for i in ids:
        rs = by_item.get(i)
        if not rs:
            missing += 1
            listed.append({"id": i, "dtype": None, "reason": "missing", "generated_tail": None})
            continue
        bad = [r for r in rs if not r.eligible]
        if bad:
            key = "error" if bad[0].error else (bad[0].reason or "?")
            inel[key] = inel.get(key, 0) + 1
        for r in bad:
            listed.append({"id": i, "dtype": r.dtype, "reason": "error" if r.error else (r.reason or "?"),
                           "generated_tail": getattr(r, "generated_tail", None)})
    if missing:
        inel["missing"] = missing
    return {"total": len(ids), "eligible": len(ids) - sum(inel.values()), "ineligible": dict(sorted(inel.items())),
            "ineligible_items": listed}


def build(
    identity: Mapping[str, Any],
    environment: Mapping[str, Any],
    items: Mapping[str, Any],
    claims: Mapping[str, ClaimResult],
    cost: Mapping[str, Any],
    analyses: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    display: Mapping[str, Mapping[str, Any]] | None = None,
    plan: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    shown = {name: {k: v for k, v in d.items() if k != "html"} for name, d in sorted((display or {}).items())}
    return {
        "schema_version": SCHEMA_VERSION,
        "rules_version": RULES_VERSION,  # which decision rules judged it (pytest_kvaudit.claims.rules)
        "model": dict(identity),
        "environment": dict(environment),
        "items": dict(items),
        "claims": {name: c.to_dict() for name, c in sorted(claims.items())},
        "analyses": _finite(dict(analyses or {})),  # JSON has no infinities: a distance over nothing is null
        "cost": dict(cost),
        "plan": dict(plan or {}),  # what the run intended, priced before it ran
        "config": dict(config or {}),
        "display": shown,
    }


def _finite(x: Any) -> Any:
    return finite(x)


def write(report: Mapping[str, Any], path: Path, sections: Mapping[str, str | None] | None = None) -> None:
    """The JSON report, written atomically (``--kvaudit-report``)."""
    atomic_write_text(path, dumps(report))


def dumps(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, default=_default) + "\n"


def _default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, float) and o != o:
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def display_of(report: Mapping[str, Any], name: str) -> dict[str, Any]:
    """How claim ``name`` shows itself: from the report's display block, else from the registered claim
    (a report written before the block existed), else the plain reason."""
    shown = report.get("display", {}).get(name)
    if shown is not None:
        return dict(shown)

    c = report["claims"][name]
    if name in {cl.name for cl in base.registered()}:
        return base.get(name).display(ClaimResult.from_dict(c))
    return {"order": USER_ORDER, "title": name, "figure": c.get("reason", ""), "rates": {}}


def ordered(report: Mapping[str, Any]) -> list[str]:
    """Claim names in display order: the paper's, then users' claims by name."""
    return sorted(report["claims"], key=lambda n: (display_of(report, n).get("order", USER_ORDER), n))


#: the order verdicts are counted in: what needs a reader first
VERDICT_ORDER = ("fail", "inconclusive", "pass")


def backend_of(report: Mapping[str, Any]) -> str:
    """The engine that ran the audit; a report written before engines were named was transformers'."""
    env = report.get("environment") or {}
    settings = ((report.get("config") or {}).get("identity") or {}).get("settings") or {}
    return str(env.get("backend") or settings.get("backend") or "transformers")


def verdict_counts(report: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(verdict, how many claims) in :data:`VERDICT_ORDER`, then any other verdict, leaving out those with none."""
    counts: dict[str, int] = {}
    for c in report.get("claims", {}).values():
        counts[c["status"]] = counts.get(c["status"], 0) + 1
    order = [s for s in VERDICT_ORDER if s in counts] + sorted(s for s in counts if s not in VERDICT_ORDER)
    return [(s, counts[s]) for s in order]


def gate_result(report: Mapping[str, Any]) -> str | None:
    """PASSED or FAILED against the baseline (a regression fails it); None where the run had no baseline."""
    cmp = report.get("baseline")
    if cmp is None:
        return None
    return "FAILED" if int(cmp.get("regressions") or 0) else "PASSED"


def summary(report: Mapping[str, Any]) -> str:
    """The run in one line: "1 FAIL · 1 INCONCLUSIVE · 4 PASS · backend vllm · gate PASSED"."""
    counts = [f"{k} {s.upper()}" for s, k in verdict_counts(report)] or ["no claim judged"]
    gate = gate_result(report)
    return " · ".join([*counts, f"backend {backend_of(report)}", f"gate {gate}" if gate else "no baseline gate"])
