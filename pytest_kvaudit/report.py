"""Pure builders for what a run shows: the JSON report (DESIGN.md's schema) and the terminal table."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .verdicts import ClaimResult

SCHEMA_VERSION = 1


def items_block(records: Iterable[Any], item_ids: Iterable[str]) -> dict[str, Any]:
    """An item is eligible when it is eligible at every precision; else counted under its first reason."""
    by_item: dict[str, list[Any]] = {}
    for r in records:
        by_item.setdefault(r.item_id, []).append(r)
    ids = list(item_ids)
    inel: dict[str, int] = {}
    missing = 0
    for i in ids:
        rs = by_item.get(i)
        if not rs:
            missing += 1
            continue
        bad = [r for r in rs if not r.eligible]
        if bad:
            key = "error" if bad[0].error else (bad[0].reason or "?")
            inel[key] = inel.get(key, 0) + 1
    if missing:
        inel["missing"] = missing
    return {"total": len(ids), "eligible": len(ids) - sum(inel.values()), "ineligible": dict(sorted(inel.items()))}


def build(
    identity: Mapping[str, Any],
    environment: Mapping[str, Any],
    items: Mapping[str, Any],
    claims: Mapping[str, ClaimResult],
    cost: Mapping[str, Any],
    analyses: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "model": dict(identity),
        "environment": dict(environment),
        "items": dict(items),
        "claims": {name: c.to_dict() for name, c in sorted(claims.items())},
        "analyses": dict(analyses or {}),
        "cost": dict(cost),
        "config": dict(config or {}),
    }


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it over: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would make a committed ledger private
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def dumps(report: Mapping[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True, default=_default) + "\n"


def _default(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, float) and o != o:
        return None
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _fmt_interval(iv: Iterable[float]) -> str:
    lo, hi = list(iv)
    return f"[{lo:.3f}, {hi:.3f}]"


def key_figure(c: ClaimResult) -> str:
    f = c.figures
    if c.name == "matched_construction" and f.get("divergent_suffixes"):
        return "; ".join(
            f"{d}: {f['divergent_suffixes'][d]}/{f['n'][d]} suffixes, {f['label_disagreements'][d]} labels, "
            f"Δacc {f['accuracy_diff'][d]:+.3f} CI {_fmt_interval(f['accuracy_diff_ci'][d])}"
            for d in f["divergent_suffixes"]
        )
    if c.name == "fixed_prefix_2x2" and f.get("disagreements"):
        parts = [f"{d}: {v}/{f['n'][d]} disagree" for d, v in f["disagreements"].items()]
        for d, hi in f.get("disagreement_upper", {}).items():
            parts.append(f"{d} Wilson upper {hi:.2%}")
        rec = f.get("recurrence_primary")
        if rec:
            parts.append(f"recurrence {rec[0]}/{rec[1]}")
        return "; ".join(parts)
    if c.name == "donor_following" and "live_to_prefill" in f:
        a, b = f["live_to_prefill"], f["prefill_to_live"]
        return f"live→prefill {a[0]}/{a[1]}, prefill→live {b[0]}/{b[1]}"
    return c.reason


#: the paper's order, then any user claims alphabetically
CLAIM_ORDER = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "ledger_audit",
               "donor_following", "layer_sweep")


def _order(name: str) -> int:
    return CLAIM_ORDER.index(name) if name in CLAIM_ORDER else len(CLAIM_ORDER)


def lines(report: Mapping[str, Any], width: int = 100) -> list[str]:
    """The terminal summary: one row per claim, then items and cost."""
    out = []
    m = report["model"]
    it = report["items"]
    out.append(f"model {m.get('id')} ({m.get('architecture')}, {m.get('num_layers')} layers, {m.get('weights_digest', '')[:19]})")
    e = report.get("environment", {})
    if e:  # the switches that decide bit-exactness, so a failed replica claim comes with where to look
        onoff = {True: "on", False: "off", None: "-"}
        out.append(
            f"environment torch {e.get('torch')}, transformers {e.get('transformers')}, device {e.get('device')} "
            f"({e.get('device_name')}, {e.get('cpu_capability')}), attn {e.get('attn_implementation')}, "
            f"threads {e.get('num_threads')}, deterministic {onoff.get(e.get('deterministic_algorithms'), '-')}, "
            f"TF32 matmul {onoff.get(e.get('tf32_matmul'), '-')}, cuBLAS workspace {e.get('cublas_workspace_config') or '-'}"
        )
    inel = ", ".join(f"{k} {v}" for k, v in it.get("ineligible", {}).items()) or "none"
    out.append(f"items {it['eligible']}/{it['total']} eligible (ineligible: {inel})")
    out.append(f"{'claim':<22} {'verdict':<13} {'k/n':>9}  {'95% interval':<17} figure")
    for name, c in sorted(report["claims"].items(), key=lambda kv: (_order(kv[0]), kv[0])):
        rc = ClaimResult(**{**c, "interval": tuple(c["interval"])})
        kn = f"{c['k']}/{c['n']}"
        fig = key_figure(rc)
        out.append(f"{name:<22} {c['status'].upper():<13} {kn:>9}  {_fmt_interval(c['interval']):<17} {fig}")
        if c["status"] != "pass" and fig != c["reason"]:
            out.append(f"{'':<22} └ {c['reason']}")
    cost = report.get("cost", {})
    if cost:
        ratio = cost["forward_tokens"] / cost["minimal_forward_tokens"] if cost.get("minimal_forward_tokens") else 0
        out.append(
            f"cost {cost['forward_calls']} forwards, {cost['forward_tokens']} tokens "
            f"({ratio:.2f}x the minimum), {cost['seconds']:.1f}s"
        )
    return out


def load_baseline(path: Path) -> dict[str, Any]:
    """A recorded report: a report JSON file, or a snapshots/<slug>/ folder holding report.json."""
    from .errors import KvauditError

    p = path / "report.json" if path.is_dir() else path
    if not p.is_file():
        raise KvauditError(f"--kvaudit-baseline: no report at {p}: record one with --snapshot-update or --kvaudit-report")
    try:
        rep = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise KvauditError(f"--kvaudit-baseline: {p} is not valid JSON (line {exc.lineno}): truncated?") from None
    if not isinstance(rep, dict) or not isinstance(rep.get("claims"), dict):
        raise KvauditError(f"--kvaudit-baseline: {p} is not a kvaudit report (no 'claims' block)")
    return rep


def _rates(claim: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """The rates a regression check watches, as (k, n): divergences, disagreements, donors followed."""
    f = claim.get("figures", {})
    out: dict[str, tuple[int, int]] = {}
    for d, v in (f.get("divergent_suffixes") or {}).items():
        out[f"divergent_suffixes[{d}]"] = (int(v), int(f.get("n", {}).get(d, 0)))
    for d, v in (f.get("disagreements") or {}).items():
        out[f"disagreements[{d}]"] = (int(v), int(f.get("n", {}).get(d, 0)))
    for key in ("live_to_prefill", "prefill_to_live"):
        if key in f:
            out[key] = (int(f[key][0]), int(f[key][1]))
    return out


def compare(baseline: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """What changed from a baseline run: verdicts, and rates that left the baseline's 95% Wilson interval."""
    from .stats import wilson_interval

    changes: list[dict[str, Any]] = []
    for name, c in sorted(current["claims"].items(), key=lambda kv: (_order(kv[0]), kv[0])):
        b = baseline["claims"].get(name)
        if b is None:
            changes.append({"claim": name, "kind": "new", "now": c["status"]})
            continue
        if b["status"] != c["status"]:
            kind = "regression" if b["status"] == "pass" and c["status"] == "fail" else "verdict"
            changes.append({"claim": name, "kind": kind, "was": b["status"], "now": c["status"]})
        old, new = _rates(b), _rates(c)
        for key, (k, n) in new.items():
            if key not in old or n == 0 or old[key][1] == 0:
                continue
            lo, hi = wilson_interval(*old[key])
            rate = k / n
            if not lo <= rate <= hi:
                changes.append({"claim": name, "kind": "rate", "figure": key, "was": list(old[key]),
                                "now": [k, n], "baseline_interval": [lo, hi]})
    return {"model_was": baseline.get("model", {}).get("weights_digest"), "changes": changes}


def compare_lines(cmp: Mapping[str, Any]) -> list[str]:
    if not cmp["changes"]:
        return ["no change from the baseline: every verdict and rate within its baseline interval"]
    out = []
    for ch in cmp["changes"]:
        if ch["kind"] == "rate":
            (k0, n0), (k1, n1) = ch["was"], ch["now"]
            lo, hi = ch["baseline_interval"]
            out.append(f"{ch['claim']}: {ch['figure']} moved {k0}/{n0} -> {k1}/{n1}, outside the baseline's [{lo:.3f}, {hi:.3f}]")
        elif ch["kind"] == "new":
            out.append(f"{ch['claim']}: new claim, {ch['now']}")
        else:
            tag = "REGRESSION " if ch["kind"] == "regression" else ""
            out.append(f"{tag}{ch['claim']}: {ch['was']} -> {ch['now']}")
    return out
