"""kvaudit's command-line options and ini keys, and their reading into an :class:`AuditConfig`.

Every flag is ``--kvaudit-*`` in the ``kvaudit`` group with an ini twin named like its dest; the flag
names are module constants that tests import. Bad values are one-line ``pytest.UsageError``s.
"""

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
from pytest_kvaudit.core.model.engines import check
from pytest_kvaudit.core.model.pipeline import ANALYSES as KNOWN
from pytest_kvaudit.core.runtime.chat import parse_mode
from pytest_kvaudit.engine_args import ENGINE_ARG, ENGINE_ARG_HELP, ENGINE_ARGS_INI, engine_args
from pytest_kvaudit.report.writers import WRITERS
from pytest_kvaudit.workers.partials import parse_shard

MODEL = "--kvaudit-model"
DTYPES = "--kvaudit-dtypes"
DEVICE = "--kvaudit-device"
DEVICE_MAP = "--kvaudit-device-map"
TF32 = "--kvaudit-tf32"
ATTN = "--kvaudit-attn"
ITEMS = "--kvaudit-items"
N = "--kvaudit-n"
BOUNDARY = "--kvaudit-boundary"
ANSWER_REGEX = "--kvaudit-answer-regex"
MAX_NEW_TOKENS = "--kvaudit-max-new-tokens"
STOP_REGEX = "--kvaudit-stop-regex"
SEED = "--kvaudit-seed"
REPORT = "--kvaudit-report"
CHUNKS = "--kvaudit-chunks"
DONOR_UNITS = "--kvaudit-donor-units"
EXACT_ITEMS = "--kvaudit-exact-items"
THREADS = "--kvaudit-threads"
TRUST_REMOTE_CODE = "--kvaudit-trust-remote-code"
ALLOW_PICKLE = "--kvaudit-allow-pickle"
CHAT_TEMPLATE = "--kvaudit-chat-template"
SNAPSHOTS = "--kvaudit-snapshots"
BASELINE = "--kvaudit-baseline"
BASELINE_FAIL = "--kvaudit-baseline-fail"
HTML = "--kvaudit-html"
LEDGER_TOKENS_ONLY = "--kvaudit-ledger-tokens-only"
STRICT = "--kvaudit-strict"
CLAIMS = "--kvaudit-claims"
ANALYSES = "--kvaudit-analyses"
CACHE = "--kvaudit-cache"
PLAN = "--kvaudit-plan"
SHARD = "--kvaudit-shard"
PARTIALS = "--kvaudit-partials"
MERGE = "--kvaudit-merge"
BACKEND = "--kvaudit-backend"
THRESHOLDS_INI = "kvaudit_thresholds"

#: flag -> help; every flag has an ini twin named like its dest (kvaudit_model, ...)
VALUE_OPTIONS: dict[str, str] = {
    MODEL: "checkpoint directory, .gguf file or hub id (default: the embedded checkpoint)",
    BACKEND: "the engine that runs the model (default: transformers)",
    DTYPES: "comma list of precisions to run, first one fixes the 2x2's prefix (default: bf16,fp32)",
    DEVICE: "auto, cpu, cuda or cuda:N (default: auto; under xdist worker i takes GPU i mod the GPU count)",
    TF32: "on or off: TF32 matmuls and convolutions for the fp32 cells on CUDA (default: torch's setting)",
    DEVICE_MAP: "a from_pretrained device_map such as auto, for a checkpoint bigger than one GPU (needs accelerate)",
    ATTN: "attention implementation(s), e.g. sdpa or eager,sdpa: the first runs the claims, the rest add axis rows",
    ITEMS: ("item set JSONL, or a built-in set: builtin:arith-v3, builtin:arith-v2, builtin:arith-v1 (default: the "
            "checkpoint's items.jsonl, else builtin:arith-v3 through a chat template, builtin:arith-v2 without one)"),
    N: "use the first N items",
    BOUNDARY: "boundary marker string, or tokens:K (default: the item set's)",
    ANSWER_REGEX: "regex whose first group is the answer (default: the item set's)",
    MAX_NEW_TOKENS: "generation budget per trajectory (default: the item set's)",
    STOP_REGEX: "a suffix ends once its text matches this regex, in every construction (default: the item set's; "
                "off: decode every suffix to its budget or EOS)",
    SEED: "seed of the paired bootstrap (default: 0); shard plans need none, they are round-robin",
    CHUNKS: "comma list of chunk sizes C: adds chunked(C) constructions",
    DONOR_UNITS: "at most this many divergent items get transplants (default: 64)",
    EXACT_ITEMS: ("compute the replicas and the incremental bridge (what the replica and bridge claims read) "
                  "on the first N items of the set only; every other claim still reads every item (default: all)"),
    BASELINE: ("gate on a recorded run (snapshots/<slug>/ or a report JSON): checked before anything loads, compared "
               "verdict by verdict and trajectory by trajectory in the kvaudit::baseline test"),
    BASELINE_FAIL: ("what fails the baseline gate: METRIC:DIRECTION,... with divergence and labels "
                    "increase|decrease|change, trajectories:change, continuations:change, verdicts:worse|change, "
                    "or none (default: divergence:increase,labels:increase,trajectories:change,verdicts:worse)"),
    SNAPSHOTS: "folder of recorded ledgers (default: snapshots/ under the rootdir)",
    THREADS: "torch CPU threads per process (default: 1, so that bits do not depend on -n)",
    CLAIMS: "comma list of built-in claim names to run (the report names them), all, or none: only your own",
    ANALYSES: ("layer_sweep, batch_invariance or all: run these analyses whatever the claims selected (default: those "
               "the selected claims quote; every one when every built-in claim runs)"),
    CACHE: ("cache kinds: dynamic,static also audits transformers' StaticCache as axis rows; offloaded (CUDA) and "
            "lossy quantized:quanto-int4, quanto-int2, hqq-int4 or fp8 go to the lossy-cache claim; on vllm only "
            "quantized:fp8 (its kv_cache_dtype=fp8) (default: dynamic)"),
    SHARD: "I/N: compute only shard I (from 0) of N, round-robin by item, and write it to --kvaudit-partials",
    PARTIALS: "folder where a --kvaudit-shard run writes its partial-I-of-N.json",
    MERGE: "folder of partials (searched recursively): judge their union, computing nothing",
    # the report's formats: one option per writer (pytest_kvaudit.report.writers)
    **{w.flag: w.help for w in WRITERS},
}
FLAG_OPTIONS: dict[str, str] = {
    TRUST_REMOTE_CODE: "allow checkpoints that need custom code (off by default)",
    ALLOW_PICKLE: "allow pickle (.bin) weights (off by default: safetensors only)",
    LEDGER_TOKENS_ONLY: "audit ledgers on token-level fields only (a cross-machine audit)",
    STRICT: "a CI gate: an inconclusive claim fails, saying what evidence was missing",
    PLAN: "print the plan (cells, forward tokens, cache memory, estimated time, what each claim can decide) "
          "after a short calibration, and run no claim",
}

CHAT_HELP = ("auto, on or off: wrap text prompts in the checkpoint's chat template (default auto: when it ships one; "
             "the bare flag means on)")


def dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvaudit", "kvaudit: does the KV cache survive stage replay")
    for flag, help_ in VALUE_OPTIONS.items():
        group.addoption(flag, dest=dest(flag), default=None, help=help_)
        parser.addini(dest(flag), help_, default="")
    for flag, help_ in FLAG_OPTIONS.items():
        group.addoption(flag, dest=dest(flag), action="store_true", default=False, help=help_)
        parser.addini(dest(flag), help_, type="bool", default=False)
    group.addoption(CHAT_TEMPLATE, dest=dest(CHAT_TEMPLATE), nargs="?", const="on", default=None, help=CHAT_HELP)
    parser.addini(dest(CHAT_TEMPLATE), CHAT_HELP, default="")
    group.addoption(ENGINE_ARG, dest=dest(ENGINE_ARG), action="append", default=None, metavar="KEY=VALUE",
                    help=ENGINE_ARG_HELP)
    parser.addini(ENGINE_ARGS_INI, "engine arguments, one KEY=VALUE a line (" + ENGINE_ARG + ")", type="linelist",
                  default=[])
    parser.addini(THRESHOLDS_INI, "claim thresholds, one 'claim.key=value' a line", type="linelist", default=[])


def value(config: pytest.Config, flag: str) -> str | None:
    v = config.getoption(dest(flag)) or config.getini(dest(flag))
    return str(v) if v not in (None, "") else None


def flag(config: pytest.Config, name: str) -> bool:
    return bool(config.getoption(dest(name)) or config.getini(dest(name)))


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


def source(config: pytest.Config, flag: str) -> str:
    """The name to put in an error: the flag when given, else its ini key."""
    return flag if config.getoption(dest(flag)) not in (None, "") else f"{dest(flag)} (ini)"


def _check_no_empty_flags(config: pytest.Config) -> None:
    """``--kvaudit-report=`` (an unset shell variable, say) would otherwise silently mean "not given"."""
    for flag in VALUE_OPTIONS:
        v = config.getoption(dest(flag))
        if v is not None and not str(v).strip():
            if flag == BOUNDARY:
                if v:
                    continue  # a whitespace marker is still a marker
                BoundaryRule.parse(str(v))  # its own message: a marker or tokens:K
            raise KvauditError(f"{flag} is empty: give a value ({VALUE_OPTIONS[flag]}) or leave the flag out")


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
        if (engine := value(config, BACKEND)) is not None:
            kw["backend"] = check(engine)
        tf32 = value(config, TF32)
        if tf32 is not None and tf32 not in ("on", "off"):
            raise KvauditError(f"{TF32}={tf32!r}: use on or off")
        kw["tf32"] = None if tf32 is None else tf32 == "on"
        attns = [a.strip() for a in (value(config, ATTN) or "").split(",") if a.strip()]
        kw["attn"] = attns[0] if attns else None
        kw["attn_axes"] = tuple(attns[1:])
        kw["cache_axes"] = parse_cache_kinds(value(config, CACHE), kw.get("backend", "transformers"))
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
        kw["engine_args"] = engine_args(config, kw.get("backend", "transformers"))
        kw["snapshots"] = value(config, SNAPSHOTS) or str(config.rootpath / "snapshots")
        return AuditConfig().replace(**kw)
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
