"""kvaudit's command-line options and ini keys: declared, and read as text (:mod:`.option_values` reads them into
an :class:`AuditConfig`).

Every flag is ``--kvaudit-*`` in the ``kvaudit`` group with an ini twin named like its dest; the flag
names are module constants that tests import. Bad values are one-line ``pytest.UsageError``s. Every pytest run of
the venv imports this module with the plugin, so it imports nothing of kvaudit's beyond the report's format list.
"""

from __future__ import annotations

import pytest

from pytest_kvaudit.report.writers import WRITERS

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
ENGINE_ARG = "--kvaudit-engine-arg"
ENGINE_ARGS_INI = "kvaudit_engine_arg"
ENGINE_ARG_HELP = ("KEY=VALUE passed to the engine, which says which keys it takes (vLLM: any vllm.LLM / EngineArgs "
                   "argument such as block_size=16, max_num_batched_tokens=256, enable_chunked_prefill=true, "
                   "kv_cache_dtype=fp8, tensor_parallel_size=2, enforce_eager=false; batch_invariant=true sets "
                   "VLLM_BATCH_INVARIANT=1, GPU only); repeatable; recorded in the ledger's environment and compared "
                   "by the gate")

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


def source(config: pytest.Config, flag: str) -> str:
    """The name to put in an error: the flag when given, else its ini key."""
    return flag if config.getoption(dest(flag)) not in (None, "") else f"{dest(flag)} (ini)"


def asked(config: pytest.Config) -> bool:
    """Whether the run names kvaudit at all: a ``--kvaudit-*`` flag on the command line or a kvaudit ini key. Such
    a run is configured at once, every value checked before anything runs; any other run audits only if it turns
    out to (a kvaudit test collected, :mod:`pytest_kvaudit.plugin`), so an unrelated run reads no config and loads
    no engine."""
    flags = (*VALUE_OPTIONS, *FLAG_OPTIONS, CHAT_TEMPLATE, ENGINE_ARG)
    if any(config.getoption(dest(f)) not in (None, False) for f in flags):
        return True
    keys = {*(dest(f) for f in flags), ENGINE_ARGS_INI, THRESHOLDS_INI}
    return any(config.getini(k) not in ("", False, [], None) for k in keys)
