"""A committed report judged again by today's rules from the counts it recorded, and re-rendered: the JSON, its
HTML and its terminal summary, each by the code that writes them in a run. Each claim re-judges its own result
(:meth:`pytest_kvaudit.claims.base.Claim.rejudge`); a claim whose rule did not change keeps its verdict. The report
then names the rules that judged it (``rules_version``) and the verdicts it had before
(``rerendered.verdicts_before``). Pure: no file is read or written here (``benchmarks/rejudge.py`` does that)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.claims import base
from pytest_kvaudit.claims.rules import RULES_VERSION
from pytest_kvaudit.core.model.config import AuditConfig


def rejudged(report: Mapping[str, Any]) -> dict[str, Any]:
    """``report`` with every registered claim's result judged again from its recorded counts, its display block
    rebuilt by the claim, and ``rules_version`` set to today's."""
    out = copy.deepcopy(dict(report))
    known = {c.name for c in base.registered()}
    before = {name: c["status"] for name, c in out.get("claims", {}).items()}
    for name, result in list(out.get("claims", {}).items()):
        if name not in known:
            continue
        claim = base.get(name)
        again = claim.rejudge(result, claim.resolve(AuditConfig()))
        if again is None:
            continue
        out["claims"][name] = again.to_dict()
        if "display" in out:
            shown = claim.display(again)
            out["display"][name] = {**out["display"].get(name, {}), **shown}
    if out.get("rules_version") != RULES_VERSION:
        out["rerendered"] = {"by": "python benchmarks/rejudge.py", "from": "the counts the run recorded",
                             "rules_version_before": out.get("rules_version", 1), "verdicts_before": before}
    out["rules_version"] = RULES_VERSION
    return out


def verdicts(report: Mapping[str, Any]) -> dict[str, Any]:
    """Each claim's verdict, and per precision where a claim records them (``figures.verdict``)."""
    return {name: (c["status"], dict(c.get("figures", {}).get("verdict") or {}))
            for name, c in report.get("claims", {}).items()}
