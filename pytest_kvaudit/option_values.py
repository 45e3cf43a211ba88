"""kvaudit's options and ini values read into an :class:`AuditConfig`, and the run's other settings checked: each
bad value a one-line ``pytest.UsageError`` before anything runs. Read once the run audits (at configure when it
names a kvaudit option), so that an unrelated run loads no config and no engine's record."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_kvaudit.claims import registered
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import (
    EMBEDDED_DIR,
    EMBEDDED_NAME,
    AuditConfig,
    BoundaryRule,
    check_output_path,
    parse_cache_kinds,
    parse_chunks,
    parse_device,
    parse_dtypes,
    parse_int,
)
from pytest_kvaudit.core.model.engines import check, engine
from pytest_kvaudit.core.model.pipeline import ANALYSES as KNOWN
from pytest_kvaudit.core.runtime.chat import parse_mode
from pytest_kvaudit.engine_args import check_run, engine_args
from pytest_kvaudit.options import (
    ALLOW_PICKLE,
    ANALYSES,
    ANSWER_REGEX,
    ATTN,
    BACKEND,
    BOUNDARY,
    CACHE,
    CHAT_TEMPLATE,
    CHUNKS,
    CLAIMS,
    DEVICE,
    DEVICE_MAP,
    DONOR_UNITS,
    DTYPES,
    EXACT_ITEMS,
    ITEMS,
    LEDGER_TOKENS_ONLY,
    MAX_NEW_TOKENS,
    MERGE,
    MODEL,
    PARTIALS,
    SEED,
    SHARD,
    SNAPSHOTS,
    STOP_REGEX,
    TF32,
    THREADS,
    TRUST_REMOTE_CODE,
    VALUE_OPTIONS,
    N,
    dest,
    flag,
    source,
    value,
)
from pytest_kvaudit.workers.partials import parse_shard

#: integer flags -> (least, most or None, what the number is), checked before anything loads
INT_RANGES: dict[str, tuple[int, int | None, str]] = {
    N: (1, None, "how many items to use"),
    MAX_NEW_TOKENS: (1, None, "tokens generated per trajectory"),
    SEED: (0, 2**32 - 1, "the bootstrap seed"),
    DONOR_UNITS: (0, None, "divergent items that get transplants; 0 turns them off"),
    EXACT_ITEMS: (1, None, "items that get the replicas and the bridge"),
    THREADS: (1, 4096, "torch CPU threads per process"),
}


def _int(config: pytest.Config, flag: str) -> int | None:
    v = value(config, flag)
    if v is None:
        return None
    lo, hi, what = INT_RANGES[flag]
    return parse_int(source(config, flag), v, lo, hi, what)


def _check_no_empty_flags(config: pytest.Config) -> None:
    """``--kvaudit-report=`` (an unset shell variable, say) would otherwise silently mean "not given"."""
    for name in VALUE_OPTIONS:
        v = config.getoption(dest(name))
        if v is not None and not str(v).strip():
            if name == BOUNDARY:
                if v:
                    continue  # a whitespace marker is still a marker
                BoundaryRule.parse(str(v))  # its own message: a marker or tokens:K
            raise KvauditError(f"{name} is empty: give a value ({VALUE_OPTIONS[name]}) or leave the flag out")


def output_path(config: pytest.Config, flag: str) -> Path | None:
    """A report path, checked now: a directory or an unwritable place is a usage error before the run."""
    v = value(config, flag)
    try:
        return check_output_path(flag, v) if v is not None else None
    except KvauditError as exc:
        raise pytest.UsageError(str(exc)) from None


def build_config(config: pytest.Config) -> AuditConfig:
    """Options and ini -> AuditConfig; bad values are a one-line usage error."""
    try:
        _check_no_empty_flags(config)
        kw: dict[str, Any] = {}
        if (m := value(config, MODEL)) is not None:
            kw["model"] = str(EMBEDDED_DIR) if m == EMBEDDED_NAME else m
        kw["items"] = value(config, ITEMS)
        kw["n"] = _int(config, N)
        kw["dtypes"] = parse_dtypes(value(config, DTYPES) or "bf16,fp32")
        kw["device"] = parse_device(value(config, DEVICE) or "auto")
        kw["device_map"] = value(config, DEVICE_MAP)
        # the engine's name, turned into its record once, here: everything below reads the record
        kw["backend"] = check(value(config, BACKEND) or AuditConfig.backend)
        kw["engine"] = spec = engine(kw["backend"])
        tf32 = value(config, TF32)
        if tf32 is not None and tf32 not in ("on", "off"):
            raise KvauditError(f"{TF32}={tf32!r}: use on or off")
        kw["tf32"] = None if tf32 is None else tf32 == "on"
        attns = [a.strip() for a in (value(config, ATTN) or "").split(",") if a.strip()]
        kw["attn"] = attns[0] if attns else None
        kw["attn_axes"] = tuple(attns[1:])
        kw["cache_axes"] = parse_cache_kinds(value(config, CACHE), spec)
        if (b := value(config, BOUNDARY)) is not None:
            BoundaryRule.parse(b)
            kw["boundary"] = b
        kw["answer_regex"] = value(config, ANSWER_REGEX)
        kw["max_new_tokens"] = _int(config, MAX_NEW_TOKENS)
        kw["stop_regex"] = value(config, STOP_REGEX)
        kw["seed"] = _int(config, SEED) or 0
        kw["chunks"] = parse_chunks(value(config, CHUNKS))
        if (d := _int(config, DONOR_UNITS)) is not None:
            kw["donor_max_units"] = d
        kw["exact_items"] = _int(config, EXACT_ITEMS)
        kw["threads"] = _int(config, THREADS)
        for name, attr in ((TRUST_REMOTE_CODE, "trust_remote_code"), (ALLOW_PICKLE, "allow_pickle"),
                           (LEDGER_TOKENS_ONLY, "ledger_tokens_only")):
            kw[attr] = flag(config, name)
        if config.getoption(dest(CHAT_TEMPLATE)) == "":
            raise KvauditError(f"{CHAT_TEMPLATE} is empty: give auto, on or off, or leave the flag out")
        if (chat := value(config, CHAT_TEMPLATE)) is not None:
            kw["chat_template"] = parse_mode(chat, source(config, CHAT_TEMPLATE))
        kw["engine_args"] = engine_args(config, spec)
        kw["snapshots"] = value(config, SNAPSHOTS) or str(config.rootpath / "snapshots")
        return check_run(AuditConfig().replace(**kw))
    except KvauditError as exc:
        raise pytest.UsageError(str(exc)) from None


def shards(config: pytest.Config) -> tuple[tuple[int, int] | None, Path | None, Path | None]:
    """(shard I/N, partials folder, merge folder): a shard needs a folder to write to, and a run either
    computes a shard or merges shards, never both."""
    text, partials, merge = value(config, SHARD), value(config, PARTIALS), value(config, MERGE)
    try:
        shard = parse_shard(text) if text is not None else None
    except KvauditError as exc:
        raise pytest.UsageError(str(exc)) from None
    if shard is not None and merge is not None:
        raise pytest.UsageError(f"{SHARD} computes a shard and {MERGE} judges all of them: give one per run")
    if shard is not None and partials is None:
        raise pytest.UsageError(f"{SHARD}={text} needs {PARTIALS}=DIR: the folder its "
                                f"partial-{shard[0]}-of-{shard[1]}.json goes to (and that --kvaudit-merge reads)")
    if partials is not None and shard is None:
        raise pytest.UsageError(f"{PARTIALS}={partials} without {SHARD}=I/N: say which shard this runner computes")
    return shard, Path(partials) if partials else None, Path(merge) if merge else None


def claim_selection(config: pytest.Config) -> tuple[str, ...] | None:
    """--kvaudit-claims: None (not given), ("all",), () for none, or the names, checked against the built-ins."""
    v = value(config, CLAIMS)
    if v is None:
        return None
    names = tuple(n.strip() for n in v.split(",") if n.strip())
    if names in (("none",), ()):
        return ()
    if names == ("all",):
        return names

    known = [c.name for c in registered()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise pytest.UsageError(f"{CLAIMS}: unknown claim {', '.join(map(repr, unknown))}; built-in claims are "
                                f"{', '.join(known)} (or all, or none to run only your own)")
    return names


def analyses_selection(config: pytest.Config) -> tuple[str, ...]:
    """--kvaudit-analyses: the analyses a run computes whatever its claims (``all``: every one)."""
    v = value(config, ANALYSES)
    names = tuple(n.strip() for n in (v or "").split(",") if n.strip())
    if names == ("all",):
        return KNOWN
    unknown = [n for n in names if n not in KNOWN]
    if unknown:
        raise pytest.UsageError(f"{ANALYSES}: unknown analysis {', '.join(map(repr, unknown))}; use "
                                f"{', '.join(KNOWN)} or all")
    return names
