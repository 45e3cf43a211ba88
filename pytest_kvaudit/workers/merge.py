"""One run's store from many processes: the xdist workers' exports or the runners' partials, merged in the
order a single process computes, and refused when they do not add up to one run. Nothing is computed and
no model loads. No pytest here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.compute.store import Store
from pytest_kvaudit.core.cost.ledger import ENV_FIELDS, MODEL_FIELDS
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.items import ItemSet
from pytest_kvaudit.core.model.records import CellRecord
from pytest_kvaudit.core.runtime.itemcheck import resolve
from pytest_kvaudit.workers import partials
from pytest_kvaudit.workers.exports import collect_exports
from pytest_kvaudit.workers.stop import StopFlag


def merged(cfg: AuditConfig, item_set: ItemSet, exports: list[dict[str, Any]]) -> Store:
    """One store over the whole item set from shard exports, in the order a single process computes.
    Shards computed in different environments (another GPU model, CPU instruction set, library) or by
    another model are refused: one run's figures must come from one environment."""
    check_one_environment(exports)
    s = Store(cfg, item_set)
    found: dict[tuple[str, str], CellRecord] = {}
    for e in exports:
        for d in e["records"]:
            r = CellRecord.from_dict(d)
            found[(r.item_id, r.dtype)] = r
        for k in ("forward_calls", "forward_tokens"):
            setattr(s.cost, k, getattr(s.cost, k) + e["cost"][k])
        s.cost.seconds = max(s.cost.seconds, e["cost"]["seconds"])
        for k, v in e.get("stages", {}).items():
            s.stages[k] = max(s.stages.get(k, 0.0), v)
        s.plan = s.plan or e.get("run_plan" if "run_plan" in e else "plan") or {}  # a runner's: its options
        s.identity = s.identity or e["identity"]
        s.environment = union(s.environment, e["environment"])
    # an item is there at every precision or missing: a worker that died takes the cells it computed along,
    # and a later precision's cell of such an item must not pass for the whole item
    s.missing = [it.id for it in item_set.items if any((it.id, d) not in found for d in cfg.dtypes)]
    lost = set(s.missing)
    for dtype in cfg.dtypes:
        for item in item_set.items:
            if item.id not in lost:
                s.records[(item.id, dtype)] = found[(item.id, dtype)]
    s.computed = True
    return s


def union(env: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    """One run's environment from its workers': the first one's, with what only another recorded (a probe's own
    engine, e.g. vLLM's fp8 one, opens only on the workers that had units for it), per precision where keyed."""
    out = dict(env)
    for k, v in (more or {}).items():
        if k not in out:
            out[k] = v
        elif isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = {**v, **out[k]}
    return out


def check_one_environment(exports: Sequence[dict[str, Any]]) -> None:
    def ident(e: dict[str, Any]) -> dict[str, Any]:
        env, model = e.get("environment") or {}, e.get("identity") or {}
        return {**{f"environment.{k}": env.get(k) for k in ENV_FIELDS},
                **{f"model.{k}": model.get(k) for k in MODEL_FIELDS}}

    computed = [e for e in exports if e.get("records")]
    if len(computed) < 2:
        return
    first = ident(computed[0])
    for e in computed[1:]:
        diff = [f"{k} {first[k]!r} vs {v!r}" for k, v in ident(e).items() if v != first[k]]
        if diff:
            raise KvauditError(f"xdist shards were computed in different environments ({'; '.join(diff[:3])}): one "
                               "run's figures must come from one environment: pin the workers to one kind of device")


def merge_exports(cfg: AuditConfig, count: int, folder: Path, stop: StopFlag | None = None) -> Store:
    """The store of this run from every xdist worker's shard (waiting for them, unless the run stops)."""
    got = collect_exports(folder, count, stop=stop)
    if got["error"]:
        raise KvauditError(got["error"])
    cfg, item_set = resolve(cfg)
    return merged(cfg, item_set, got["exports"])


def merge_partials(cfg: AuditConfig, folder: Path) -> tuple[AuditConfig, Store]:
    """The store of one run over all items, from the runners' partials; nothing is computed, no model loads.
    The run's config becomes the shards' plan (returned), so thresholds, analyses and the report see what a
    single run would have seen."""
    parts = partials.load(folder)
    partials.check(parts, folder)
    head = parts[0][1]
    cfg = partials.config(head, cfg)
    store = merged(cfg, partials.item_set(head), partials.exports(parts))
    if store.missing:
        raise KvauditError(f"kvaudit merge: the partials in {folder} lack {len(store.missing)} items of the set "
                           f"(first {store.missing[0]!r}): re-run the shard that should hold it")
    return cfg, store
