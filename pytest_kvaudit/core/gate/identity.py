"""The checkpoint gate's identity: what a baseline must share with a run.

``--kvaudit-baseline`` compares checkpoint N+1 with checkpoint N. The weights differ (that is the point), but
the comparison means something only when both runs asked the same question: the same architecture and depth,
the same items (ids, prompts, answers, count), and the same settings that decide the bits of a trajectory and
which cells exist (backend, precisions, attention, TF32, chat template, threads, constructions, boundary,
answer regex, generation budget). :func:`run_identity` says that for a run from its config and item set, before
any model loads; :func:`mismatches` lists what differs, one line a field with both values. Pure data, no pytest, no
torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.runtime import gguf
from pytest_kvaudit.core.runtime.itemcheck import item_set_name, resolve
from pytest_kvaudit.core.runtime.loading import read_config, resolve_checkpoint

#: the settings (AuditConfig fields and the item set's rules) that decide the bits of a trajectory or which cells
#: a run computes; the weights digest is deliberately not among the compared fields
SETTINGS = ("backend", "dtypes", "attn", "tf32", "device_map", "chat_template", "threads", "chunks", "cache_axes",
            "donor_max_units", "constructions", "boundary", "answer_regex", "max_new_tokens", "exact_items")
MODEL_FIELDS = ("architecture", "num_layers")
#: what an unset setting means, where it means one value: an unset setting and its default are the same setting
#: (``--kvaudit-threads`` unset runs one thread); an unset ``attn`` is the checkpoint's default, which the
#: baseline's report names (``environment.attn_implementation``) and :func:`mismatches` is handed
DEFAULTS: dict[str, Any] = {"threads": 1}


def items_digest(items: Any) -> str:
    """A digest of every item's id, prompt, prompt ids, answer and boundary (the shards' digest)."""
    h = hashlib.sha256()
    for it in items:
        h.update(json.dumps([it.id, it.prompt, list(it.prompt_ids or ()), it.answer, it.boundary]).encode())
        h.update(b"\n")
    return f"sha256:{h.hexdigest()}"


def _model(cfg: AuditConfig, local: Path) -> dict[str, Any]:
    """Architecture and depth from config.json or the GGUF header: no weights read, no torch."""
    if (g := gguf.gguf_file(local)) is not None:
        meta = gguf.read_header(g)["metadata"]
        arch = str(meta.get("general.architecture", "unknown"))
        return {"architecture": arch, "num_layers": int(meta.get(f"{arch}.block_count", 0) or 0)}
    c = read_config(local)
    text_cfg = c.get("text_config") or {}
    layers = c.get("num_hidden_layers", c.get("n_layer", text_cfg.get("num_hidden_layers", 0)))
    return {"architecture": (c.get("architectures") or [c.get("model_type", "unknown")])[0],
            "num_layers": int(layers or 0)}


def run_identity(cfg: AuditConfig) -> dict[str, Any]:
    """What a run asks, as the gate compares it: model shape, items and settings. Reads config.json (or a GGUF
    header) and the item file only."""
    cfg, iset = resolve(cfg)
    work = cfg.work_identity()
    settings = {k: work[k] for k in SETTINGS if k in work}
    settings.update(cache_axes=list(cfg.cache_axes), boundary=iset.boundary, answer_regex=iset.answer_regex,
                    max_new_tokens=iset.max_new_tokens, **({"stop_regex": iset.stop_regex} if iset.stop_regex else {}))
    return {"model": _model(cfg, resolve_checkpoint(cfg.model, cfg.trust_remote_code)),
            "items": {"set": item_set_name(iset), "count": len(iset.items), "digest": items_digest(iset.items)},
            "settings": settings}


def partial_identity(head: Mapping[str, Any]) -> dict[str, Any]:
    """A merge run's identity, from a partial's header (the merge refuses partials that disagree)."""
    plan, iset, model = head.get("plan", {}), head.get("item_set", {}), head.get("model", {})
    settings = {k: plan.get(k) for k in SETTINGS if k in plan}
    settings.update({k: iset.get(k) for k in ("boundary", "answer_regex", "max_new_tokens")})
    if iset.get("stop_regex"):
        settings["stop_regex"] = iset["stop_regex"]
    return {"model": {k: model.get(k) for k in MODEL_FIELDS},
            "items": {"set": iset.get("name"), "count": iset.get("count"), "digest": iset.get("digest")},
            "settings": settings}


def recorded_identity(report: Mapping[str, Any]) -> dict[str, Any]:
    """A baseline report's identity: its ``config.identity`` block, or what an older report says (model,
    item set name and count, precisions); fields it never recorded are left out, not guessed."""
    if isinstance(report.get("config", {}).get("identity"), Mapping):
        return dict(report["config"]["identity"])
    m, it, c = report.get("model", {}), report.get("items", {}), report.get("config", {})
    return {"model": {k: m[k] for k in MODEL_FIELDS if k in m},
            "items": {k: v for k, v in (("set", it.get("set")), ("count", it.get("total"))) if v is not None},
            "settings": {"dtypes": c["dtypes"]} if "dtypes" in c else {}}


def _show(v: Any) -> str:
    if isinstance(v, (list, tuple)):
        return ",".join(map(str, v)) or "(none)"
    return repr(v) if isinstance(v, str) else str(v)


def _same(field: str, a: Any, b: Any, resolved: Mapping[str, Any]) -> bool:
    """Whether two values of a setting are the same setting, an unset one read as its default."""
    default = {**DEFAULTS, **{k: v for k, v in resolved.items() if v is not None}}.get(field)
    return (default if a is None else a) == (default if b is None else b)


def mismatches(baseline: Mapping[str, Any], run: Mapping[str, Any], resolved: Mapping[str, Any] = {}) -> list[str]:
    """What keeps ``baseline`` from being compared with ``run``, one line a field naming both values. An unset
    setting is its default (:data:`DEFAULTS`, and ``resolved``: what the baseline's unset settings resolved to,
    such as its attention implementation), so stating a default never refuses a baseline that left it unset."""
    out = []
    bm, rm = baseline.get("model", {}), run.get("model", {})
    for f in MODEL_FIELDS:
        if f in bm and bm[f] != rm.get(f):
            out.append(f"model.{f}: baseline {_show(bm[f])}, this run {_show(rm.get(f))}")
    bi, ri = baseline.get("items", {}), run.get("items", {})
    if "count" in bi and bi["count"] != ri.get("count"):
        out.append(f"n (items): baseline {bi['count']}, this run {ri.get('count')} (--kvaudit-n)")
    elif "digest" in bi and bi["digest"] != ri.get("digest"):
        out.append(f"items: baseline {bi.get('set')} ({str(bi['digest'])[:19]}), this run {ri.get('set')} "
                   f"({str(ri.get('digest'))[:19]}): another item set (ids, prompts or answers differ)")
    elif "digest" not in bi and "set" in bi and bi["set"] != ri.get("set"):
        out.append(f"items.set: baseline {_show(bi['set'])}, this run {_show(ri.get('set'))}")
    bs, rs = baseline.get("settings", {}), run.get("settings", {})
    for f in SETTINGS:  # a field one side never recorded (an older report) is not compared
        if f in bs and f in rs and not _same(f, bs[f], rs[f], resolved):
            out.append(f"settings.{f}: baseline {_show(bs[f])}, this run {_show(rs.get(f))}")
    if bs.get("stop_regex") != rs.get("stop_regex"):  # written only where a set has one: absent is none
        out.append(f"settings.stop_regex: baseline {_show(bs.get('stop_regex'))}, this run "
                   f"{_show(rs.get('stop_regex'))}")
    return out
