"""Shards over runners: one runner's shard of the items as a partial file, and the merge of all shards.

``--kvaudit-shard=I/N --kvaudit-partials=DIR`` computes the items whose index is I modulo N (the split
xdist uses, so a shard of a shard under ``-n`` composes) and writes ``DIR/partial-I-of-N.json``: the store
exports of its processes plus what decides whether shards may be added up: the model's identity, the
environment, the item set (count and a digest of ids and prompts) and the plan (the config fields that
decide what is computed). ``--kvaudit-merge=DIR`` reads every partial under DIR (artifact downloads put
each in its own folder, so the search is recursive), refuses shards that do not add up to one run with one
line naming the files and the field, and hands the exports to :func:`pytest_kvaudit.workers.merge.merged`: the claims
then judge exactly the records a single run over all items computes.

Plain data and files only: no pytest, no torch.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.cost.ledger import ENV_FIELDS, MODEL_FIELDS
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import EMBEDDED_DIR, WORK_FIELDS, AuditConfig
from pytest_kvaudit.core.model.items import Item, ItemSet

PARTIAL_VERSION = 1
PARTIAL_RE = re.compile(r"partial-(\d+)-of-(\d+)\.json")
#: what decides what a shard computes (AuditConfig.work_identity): shards must agree on every one of them
PLAN_FIELDS = (*WORK_FIELDS, "constructions")
#: item-set fields compared across shards (the path is left out: each runner checks out to its own folder)
ITEM_SET_FIELDS = ("count", "digest", "boundary", "answer_regex", "max_new_tokens", "stop_regex")


def parse_shard(text: str) -> tuple[int, int]:
    """``I/N`` with shards numbered from 0, or a one-line error saying what is wrong."""
    m = re.fullmatch(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*", text)
    if m is None:
        raise KvauditError(f"--kvaudit-shard={text!r} is not I/N: give this runner's shard I of N shards, e.g. 0/3")
    i, n = int(m.group(1)), int(m.group(2))
    if n < 1 or i >= n:
        raise KvauditError(f"--kvaudit-shard={text}: I must be from 0 to N-1 (shards are numbered from 0), e.g. "
                           f"0/{max(n, 1)}")
    return i, n


def partial_name(index: int, count: int) -> str:
    return f"partial-{index}-of-{count}.json"


# -- what a partial says about itself ----------------------------------------------------------------
def item_set_info(item_set: ItemSet, name: str) -> dict[str, Any]:
    """The item set as shards compare it: its size, a digest of every id and prompt, and its rules."""
    h = hashlib.sha256()
    for it in item_set.items:
        h.update(json.dumps([it.id, it.prompt, list(it.prompt_ids or ()), it.answer, it.boundary]).encode())
        h.update(b"\n")
    return {"name": name, "path": str(item_set.path), "count": len(item_set.items), "digest": f"sha256:{h.hexdigest()}",
            "boundary": item_set.boundary, "answer_regex": item_set.answer_regex,
            "max_new_tokens": item_set.max_new_tokens, "stop_regex": item_set.stop_regex, "chat": item_set.chat,
            # ids and answers in order: the merge rebuilds the set's order and labels without the file
            "items": [[it.id, it.answer] for it in item_set.items]}


def build(index: int, count: int, exports: list[dict[str, Any]]) -> dict[str, Any]:
    """A partial from the exports of the processes that computed the shard (one, or one per xdist worker)."""
    head = exports[0]
    return {"kvaudit_partial": PARTIAL_VERSION, "shard": [index, count], "model": head["identity"],
            "environment": head["environment"], "item_set": head["item_set"], "plan": head["plan"],
            "exports": exports}


def write(folder: Path, index: int, count: int, exports: list[dict[str, Any]]) -> Path:
    path = folder / partial_name(index, count)
    atomic_write_text(path, json.dumps(build(index, count, exports), default=list))
    return path


# -- the merge -----------------------------------------------------------------------------------
def load(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Every ``partial-I-of-N.json`` under ``folder``, in path order; a missing folder or a broken file is an error."""
    if not folder.is_dir():
        raise KvauditError(f"--kvaudit-merge={folder}: no such folder: point it at the --kvaudit-partials folder")
    paths = sorted(p for p in folder.rglob("partial-*-of-*.json") if PARTIAL_RE.fullmatch(p.name))
    if not paths:
        raise KvauditError(f"--kvaudit-merge={folder}: no partial-I-of-N.json under it: run each shard with "
                           f"--kvaudit-shard=I/N --kvaudit-partials={folder} first")
    out = []
    for p in paths:
        try:
            doc = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise KvauditError(f"kvaudit merge: {p} cannot be read ({exc}): re-run its shard") from None
        if not isinstance(doc, dict) or doc.get("kvaudit_partial") != PARTIAL_VERSION:
            raise KvauditError(f"kvaudit merge: {p} is not a kvaudit partial of version {PARTIAL_VERSION}: re-run its "
                               "shard with this kvaudit")
        out.append((p, doc))
    return out


def _show(v: Any) -> str:
    s = json.dumps(v, default=list)
    return s if len(s) <= 40 else s[:37] + "..."


def check(parts: list[tuple[Path, dict[str, Any]]], folder: Path) -> None:
    """Refuse shards that are not one run split N ways: one line naming the files and the field that differs."""
    model_fields = ("weights_digest", *(f for f in MODEL_FIELDS if f != "weights_digest"))  # the usual culprit first

    def name(p: Path) -> str:
        return str(p.relative_to(folder)) if p.is_relative_to(folder) else str(p)

    counts = {int(d["shard"][1]) for _, d in parts}
    if len(counts) > 1:
        shown = ", ".join(f"{name(p)} ({d['shard'][0]}/{d['shard'][1]})" for p, d in parts)
        raise KvauditError(f"kvaudit merge: partials of different shard counts N {sorted(counts)} in {folder}: {shown} "
                           "(field shard): merge the partials of one sharded run")
    n = counts.pop()
    by_index: dict[int, list[Path]] = {}
    for p, d in parts:
        by_index.setdefault(int(d["shard"][0]), []).append(p)
    for i, ps in sorted(by_index.items()):
        if len(ps) > 1:
            raise KvauditError(f"kvaudit merge: shard {i}/{n} appears {len(ps)} times: {', '.join(map(name, ps))} "
                               "(field shard): keep one")
    missing = [i for i in range(n) if i not in by_index]
    if missing:
        have = ", ".join(name(p) for p, _ in parts)
        raise KvauditError(f"kvaudit merge: shard {', '.join(f'{i}/{n}' for i in missing)} missing from {folder} "
                           f"(have {have}): run --kvaudit-shard={missing[0]}/{n} --kvaudit-partials={folder}")
    (p0, d0), rest = parts[0], parts[1:]
    sections: list[tuple[str, Iterable[str], str]] = [
        ("model", model_fields, "every shard must come from one model"),
        ("environment", ENV_FIELDS, "every shard must run in one environment (the bits depend on it)"),
        ("item_set", ITEM_SET_FIELDS, "every shard must split one item set"),
        ("plan", PLAN_FIELDS, "every shard must run one plan (the same kvaudit options)"),
    ]
    for section, fields, why in sections:
        for f in fields:
            for p, d in rest:
                a, b = d0[section].get(f), d[section].get(f)
                if a != b:
                    raise KvauditError(f"kvaudit merge: {name(p)} differs from {name(p0)} in {section}.{f} "
                                       f"({_show(b)} vs {_show(a)}): {why}")


def item_set(doc: dict[str, Any]) -> ItemSet:
    """The item set as the merge needs it (order, ids, answers and rules), rebuilt from a partial."""
    s = doc["item_set"]
    return ItemSet(Path(s["path"]), tuple(Item(str(i), str(a)) for i, a in s["items"]), s["boundary"],
                   s["answer_regex"],
                   int(s["max_new_tokens"]), s.get("stop_regex"), dict(s.get("chat") or {}))


def config(doc: dict[str, Any], own: AuditConfig) -> AuditConfig:
    """The merge's config: the shards' plan, and the merge run's own judging options (seed, snapshots...)."""
    plan = {k: tuple(v) if isinstance(v, list) else v for k, v in doc["plan"].items() if k in WORK_FIELDS}
    s = doc["item_set"]
    model = str(EMBEDDED_DIR) if doc["model"].get("id") == "embedded" else str(doc["model"].get("id") or own.model)
    return own.replace(**plan, model=model, items=s["path"], boundary=s["boundary"], answer_regex=s["answer_regex"],
                       max_new_tokens=s["max_new_tokens"], stop_regex=s.get("stop_regex") or "off")


def exports(parts: list[tuple[Path, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [e for _, d in sorted(parts, key=lambda pd: int(pd[1]["shard"][0])) for e in d["exports"]]
