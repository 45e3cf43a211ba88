"""The ledger: per item and precision, the ids, boundary, suffixes, labels and fingerprints of a run,
plus the model's and environment's identity; and the audit of a run against a recorded ledger.

Token lists are stored as space-separated strings, one field a line, so that a diff of two ledgers
names the item and field that moved. Pure data, no pytest: syrupy's extension (``snapshot.py``) only
stores and reads these documents.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.digests import digest, fingerprint_ids

LEDGER_VERSION = 1
#: fields that say which model produced a ledger: any difference refuses the audit
MODEL_FIELDS = ("architecture", "num_layers", "weights_digest", "config_digest")
#: run settings that decide what was computed
#: (``stop_regex`` is written only where the item set has one, ``exact_items`` only where the run set it, so a
#: ledger recorded before either existed still reads)
CONFIG_FIELDS = ("boundary", "max_new_tokens", "answer_regex", "dtypes", "stop_regex", "exact_items")
#: environment fields that decide bit-exactness: a full audit refuses when any differs
ENV_FIELDS = ("torch", "transformers", "cuda", "device", "device_name", "cpu_capability", "cpu_isa",
              "attn_implementation",
              "num_threads", "deterministic_algorithms", "tf32_matmul", "tf32_cudnn", "float32_matmul_precision")
TOKEN_FIELDS = ("generated", "boundary", "reason", "prompt_ids_digest")
CONTINUATION_TOKEN_FIELDS = ("suffix", "label")
CONTINUATION_FP_FIELDS = ("state_fp", "logits_fp")


def ids(xs: Any) -> str:
    return " ".join(str(int(x)) for x in xs)


def slug(model_id: str) -> str:
    """A folder name for a model: the checkpoint folder's name, a checkpoint file's name (a GGUF), or
    org--name for a hub id."""
    p = Path(model_id)
    if p.is_file():
        return re.sub(r"[^\w.-]+", "-", p.name) or "model"
    if p.is_dir():
        name = p.resolve().name
        if name == "embedded" and p.resolve().parent.name in ("fixtures", "pytest_kvaudit"):
            return "embedded"
        return re.sub(r"[^\w.-]+", "-", name) or "model"
    return re.sub(r"[^\w.-]+", "-", model_id.replace("/", "--"))


def snapshot_folder(snapshots: str | Path | None, model_id: str) -> Path:
    """A model's folder of recorded runs, ``<snapshots>/<slug>/`` (``--kvaudit-snapshots``, default
    ``snapshots``): its ledger (``test_ledger_audit/test_ledger_audit.json``) and its ``report.json``. The one
    place that spells the layout."""
    return Path(snapshots or "snapshots") / slug(model_id)


def _cont(c: Any) -> dict[str, Any]:
    # an engine's warm construction also keeps the tokens it reused: a replay that reused otherwise is another unit
    reused = {"reused": c.reused} if getattr(c, "reused", None) is not None else {}
    return {"suffix": ids(c.suffix), "label": bool(c.label), "state_fp": c.state_fp, "logits_fp": c.logits_fp, **reused}


def unit_of(r: Any, with_transplants: bool = True) -> dict[str, Any]:
    """One (item, precision) record as ledger data (all-layer transplants only: the layer sweep is
    descriptive and its units depend on the shard plan)."""
    u: dict[str, Any] = {
        "prompt_ids_digest": fingerprint_ids(r.prompt_ids),
        "generated": ids(r.generated),
        "boundary": r.boundary,
        "reason": r.reason or r.error,
    }
    if r.constructions:
        u["constructions"] = {k: _cont(c) for k, c in sorted(r.constructions.items())}
        live, pre = r.constructions["live"], r.constructions["prefill"]
        h = digest(b"comparison")
        h.update(f"{live.state_fp}|{pre.state_fp}|{live.logits_fp}|{pre.logits_fp}".encode())
        u["comparison_fp"] = h.hexdigest()
    if r.fixed:
        u["fixed"] = {k: _cont(c) for k, c in sorted(r.fixed.items())}
    whole = r.whole_transplants()
    if whole and with_transplants:
        u["transplants"] = {f"{t.direction}/all/kv": {"suffix": ids(t.suffix), "followed": t.followed} for t in whole}
        # every transplant continuation's tokens (the sweep's and the controls' too): what a plan needs to price
        # a re-run exactly (:func:`pytest_kvaudit.core.cost.pricing.units_of_ledger`); cost bookkeeping, not audited
        u["transplant_tokens"] = sum(len(t.suffix) for t in r.transplants)
    return u


def build(store: Any) -> dict[str, Any]:
    """The ledger document of a computed store."""
    cfg, iset = store.cfg, store.item_set
    # the donor units the claim judges: the first donor_max_units divergent records, whatever -n
    chosen = [r for r in store.records.values() if r.whole_transplants()]
    donors = {id(r) for r in chosen[: cfg.donor_max_units]}
    return {
        "kvaudit_ledger": LEDGER_VERSION,
        "model": {"id": slug(str(store.identity.get("id", ""))), **{k: store.identity.get(k) for k in MODEL_FIELDS}},
        "environment": {k: store.environment.get(k) for k in ENV_FIELDS},
        "config": {"boundary": iset.boundary, "max_new_tokens": iset.max_new_tokens,
                   "answer_regex": iset.answer_regex, "dtypes": list(cfg.dtypes),
                   **({"stop_regex": iset.stop_regex} if iset.stop_regex is not None else {}),
                   **({"exact_items": cfg.exact_items} if cfg.exact_items is not None else {})},
        "units": {f"{r.item_id}@{r.dtype}": unit_of(r, id(r) in donors) for r in store.records.values()},
    }


def parse(text: str, where: str) -> dict[str, Any]:
    """A ledger document from its file text; a truncated or hand-broken file is one error naming it."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvauditError(
            f"ledger {where} is not valid JSON (line {exc.lineno}: {exc.msg}): truncated or edited by hand? "
            "restore it from git or re-record with --snapshot-update"
        ) from None
    if (not isinstance(doc, dict) or doc.get("kvaudit_ledger") != LEDGER_VERSION
            or not isinstance(doc.get("units"), dict)):
        raise KvauditError(f"ledger {where} is not a kvaudit ledger (version {LEDGER_VERSION}): re-record with "
                           "--snapshot-update")
    for key in ("model", "environment", "config"):
        if not isinstance(doc.get(key), dict):
            raise KvauditError(f"ledger {where} lacks its '{key}' block: re-record with --snapshot-update")
    if not doc["units"]:
        raise KvauditError(f"ledger {where} holds no units: re-record it with --snapshot-update")
    for name, u in doc["units"].items():
        if not isinstance(u, dict) or "generated" not in u:
            raise KvauditError(f"ledger {where}: unit {name!r} is malformed: re-record with --snapshot-update")
    return doc


def read(path: Path) -> dict[str, Any]:
    """The ledger at ``path``, parsed; an unreadable or damaged file is one error naming it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise KvauditError(f"ledger {path} is not UTF-8 text: restore it from git or re-record with "
                           "--snapshot-update") from None
    except OSError as exc:
        raise KvauditError(f"ledger {path} cannot be read ({exc.strerror}): check its permissions") from None
    return parse(text, str(path))


def sweep_temporary(path: Path) -> list[Path]:
    """Remove what a killed atomic write of ``path`` left behind (``.NAME.*.tmp`` beside it)."""
    gone = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            tmp.unlink()
            gone.append(tmp)
        except OSError:
            pass
    return gone


def identity_differences(recorded: Mapping[str, Any], current: Mapping[str, Any], tokens_only: bool) -> list[str]:
    """What makes ``recorded`` another model's or another environment's ledger, one phrase each."""
    out = []
    blocks: list[tuple[str, tuple[str, ...]]] = [("model", MODEL_FIELDS), ("config", CONFIG_FIELDS)]
    if not tokens_only:
        blocks.append(("environment", ENV_FIELDS))
    for block, fields in blocks:
        for f in fields:
            a, b = recorded[block].get(f), current[block].get(f)
            if a != b:
                out.append(f"{block}.{f} recorded {a!r}, now {b!r}")
    return out


@dataclass
class Audit:
    units: int = 0  # units judged (recorded and run)
    reproduced: int = 0
    mismatches: dict[str, list[str]] = field(default_factory=dict)  # unit -> fields that differ
    not_recorded: list[str] = field(default_factory=list)  # run now, absent from the ledger
    not_run: int = 0  # recorded, not part of this run (e.g. a smaller --kvaudit-n)


def _diff_cont(prefix: str, a: Mapping[str, Any], b: Mapping[str, Any], tokens_only: bool) -> list[str]:
    out = []
    for name in sorted(set(a) | set(b)):
        ca, cb = a.get(name), b.get(name)
        if ca is None or cb is None:
            out.append(f"{prefix}.{name}")
            continue
        fields = CONTINUATION_TOKEN_FIELDS + ("followed",) if tokens_only else tuple(sorted(set(ca) | set(cb)))
        out += [f"{prefix}.{name}.{f}" for f in fields if ca.get(f) != cb.get(f)]
    return out


def audit(recorded: Mapping[str, Any], current: Mapping[str, Any], tokens_only: bool = False) -> Audit:
    """Compare every unit both ledgers hold, field by field (exact string and integer equality)."""
    res = Audit()
    rec_units, cur_units = recorded["units"], current["units"]
    res.not_run = sum(1 for u in rec_units if u not in cur_units)
    for name, cu in cur_units.items():
        ru = rec_units.get(name)
        if ru is None:
            res.not_recorded.append(name)
            continue
        res.units += 1
        diffs = [f for f in TOKEN_FIELDS if ru.get(f) != cu.get(f)]
        if not tokens_only and ru.get("comparison_fp") != cu.get("comparison_fp"):
            diffs.append("comparison_fp")
        for block in ("constructions", "fixed", "transplants"):
            diffs += _diff_cont(block, ru.get(block, {}), cu.get(block, {}), tokens_only)
        if diffs:
            res.mismatches[name] = diffs
        else:
            res.reproduced += 1
    return res


def token_level(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """What survives a change of environment, per precision: of the units both ledgers hold, how many
    trajectories (generated ids) and how many continuation suffixes (constructions, fixed cells, transplants)
    came back token for token. Bits depend on the CPU's instruction set and the libraries; token ids are
    what a user on another machine can still compare, and the count says how far the run moved."""
    out: dict[str, dict[str, int]] = {}
    for name, cu in current["units"].items():
        ru = recorded["units"].get(name)
        if ru is None:
            continue
        c = out.setdefault(name.rsplit("@", 1)[-1], dict.fromkeys(
            ("units", "units_reproduced", "trajectories_reproduced", "suffixes", "suffixes_reproduced"), 0))
        c["units"] += 1
        c["trajectories_reproduced"] += int(ru.get("generated") == cu.get("generated"))
        c["units_reproduced"] += int(not [f for f in TOKEN_FIELDS if ru.get(f) != cu.get(f)]
                                     and not any(_diff_cont(b, ru.get(b, {}), cu.get(b, {}), True)
                                                 for b in ("constructions", "fixed", "transplants")))
        for block in ("constructions", "fixed", "transplants"):
            ra, ca = ru.get(block, {}), cu.get(block, {})
            for k in set(ra) & set(ca):
                c["suffixes"] += 1
                c["suffixes_reproduced"] += int(ra[k].get("suffix") == ca[k].get("suffix"))
    return dict(sorted(out.items()))


def matches(recorded_text: str, current_text: str, tokens_only: bool) -> bool:
    """syrupy's comparison, asked only when ``--snapshot-update`` records a ledger (``ledger_audit`` audits a
    plain run itself, with :func:`audit`): the same document, so that an update rewrites a ledger whenever
    anything in it would change, bookkeeping such as ``transplant_tokens`` included."""
    try:
        return bool(json.loads(recorded_text) == json.loads(current_text))
    except json.JSONDecodeError:
        return False


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"
