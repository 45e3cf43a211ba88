"""What one audit run is asked to do, as plain data: parsed and validated, no torch, no pytest."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model import cache_kinds as lossy
from pytest_kvaudit.core.model import engines
from pytest_kvaudit.core.model.cache_kinds import known_kind
from pytest_kvaudit.core.model.engine_protocol import Engine
from pytest_kvaudit.core.model.pipeline import computes
from pytest_kvaudit.core.model.precisions import low_precision, parse_dtypes  # noqa: F401 (options read it here)
from pytest_kvaudit.core.model.schedules import extra_constructions

PACKAGE_DIR = Path(__file__).resolve().parents[2]  # pytest_kvaudit/, this file being in core/model/
# Installed wheels carry the checkpoint as package data; a source checkout keeps it in fixtures/.
EMBEDDED_DIR = next(
    (p for p in (PACKAGE_DIR / "embedded", PACKAGE_DIR.parent / "fixtures" / "embedded") if p.is_dir()),
    PACKAGE_DIR.parent / "fixtures" / "embedded",
)

# The built-in claims: the package's suites/ in a wheel, the repository's suites/ in a clone (their home).
SUITES_DIR = next(
    (p for p in (PACKAGE_DIR / "suites", PACKAGE_DIR.parent / "suites") if (p / "__init__.py").is_file()),
    PACKAGE_DIR / "suites",
)
# The embedded checkpoint's recorded ledger, shipped so that a first run from a wheel audits against it.
EMBEDDED_SNAPSHOTS = next(
    (p for p in (PACKAGE_DIR / "embedded_snapshots", PACKAGE_DIR.parent / "snapshots" / "embedded") if p.is_dir()),
    PACKAGE_DIR / "embedded_snapshots",
)
#: what --kvaudit-model=embedded names
EMBEDDED_NAME = "embedded"

#: Precisions whose rounding is coarse enough that live and prefill caches are expected to differ
#: (:data:`pytest_kvaudit.core.model.precisions.PRECISIONS` declares each one's ``low``)
LOW_PRECISION = low_precision()


def parse_device(text: str) -> str:
    t = text.strip().lower()
    if t in ("auto", "cpu", "cuda", "mps") or re.fullmatch(r"cuda:\d+", t):
        return t
    raise KvauditError(f"--kvaudit-device: {text!r} is not auto, cpu, cuda or cuda:N")


def parse_chunks(text: str | None) -> tuple[int, ...]:
    if not text:
        return ()
    try:
        vals = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise KvauditError(f"--kvaudit-chunks: {text!r} is not a comma list of chunk sizes such as 16,64") from None
    if any(v < 1 for v in vals):
        raise KvauditError(f"--kvaudit-chunks: chunk sizes must be positive, got {text!r}")
    return vals


def parse_engine_args(pairs: Iterable[str], source: str = "--kvaudit-engine-arg") -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` strings -> sorted ``(key, value)`` pairs; a key given twice, a missing ``=`` or a key that is
    not a Python name is one line naming it."""
    out: dict[str, str] = {}
    for p in pairs:
        key, eq, val = str(p).partition("=")
        key = key.strip()
        if not eq or not key.isidentifier() or not val.strip():
            raise KvauditError(f"{source} {p!r}: give KEY=VALUE, e.g. block_size=16 or enable_chunked_prefill=true")
        if key in out:
            raise KvauditError(f"{source}: {key} is given twice ({key}={out[key]} and {key}={val.strip()}); give it "
                               "once")
        out[key] = val.strip()
    return tuple(sorted(out.items()))


def parse_cache_kinds(text: str | None, engine: Engine) -> tuple[str, ...]:
    """``--kvaudit-cache=dynamic,static,quantized:quanto-int4`` -> the kinds beyond the dynamic one, which the
    claims always run on. Each is checked here against what ``engine`` (its record) runs, then a quantized kind
    with its extra, so a kind the engine cannot run or a missing package is one line before anything loads."""
    kinds = [p.strip().lower() for p in (text or "dynamic").split(",") if p.strip()]
    bad = [k for k in kinds if not known_kind(k)]
    if bad or not kinds:
        raise KvauditError(f"--kvaudit-cache={text!r}: use a comma list of dynamic and static, also {lossy.OFFLOADED} "
                           "and lossy quantized:quanto-int4, quantized:quanto-int2, quantized:hqq-int4, quantized:fp8 "
                           "(default: dynamic)")
    out = engine.check_cache_kinds(tuple(dict.fromkeys(k for k in kinds if k != "dynamic")))
    for k in out:
        lossy.check_kind(k)
    return out


def parse_int(flag: str, text: str, lo: int, hi: int | None = None, what: str = "") -> int:
    """A whole number from ``lo`` to ``hi`` (ASCII digits), or a one-line error naming the flag and the range."""
    rng = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
    why = f" ({what})" if what else ""
    t = text.strip()
    if not re.fullmatch(r"[+-]?[0-9]{1,30}", t):
        raise KvauditError(f"{flag}={text!r} is not a whole number: give an integer {rng}{why}")
    v = int(t)
    if v < lo or (hi is not None and v > hi):
        raise KvauditError(f"{flag}={text!r} is out of range: give an integer {rng}{why}")
    return v


def parse_threshold_value(where: str, text: str) -> float:
    """A finite number for a claim threshold (nan or inf would make every comparison silently false or true)."""
    try:
        v = float(text)
    except ValueError:
        raise KvauditError(f"{where}: {text.strip()!r} is not a number") from None
    if not math.isfinite(v):
        raise KvauditError(f"{where}: {text.strip()!r} is not a finite number")
    return v


def check_output_path(flag: str, text: str) -> Path:
    """Where a report will be written, checked before the run: not a directory, and its folder writable.

    The probe creates (and removes) a temporary file named as the final write names its own, in the nearest
    folder that exists, so what fails here is what would fail after the whole run.
    """
    p = Path(text).expanduser()
    if text.endswith(("/", os.sep)) or p.is_dir():
        raise KvauditError(f"{flag}={text} is a directory: give a file path such as {p / 'kvaudit-report'}")
    anc = p.absolute().parent
    while not anc.exists() and anc != anc.parent:
        anc = anc.parent
    if not anc.is_dir():
        raise KvauditError(f"{flag}={text}: {anc} is a file, not a folder: choose a path in a writable folder")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=anc)
    except OSError as exc:
        raise KvauditError(
            f"{flag}={text}: cannot write in {anc} ({exc.strerror or type(exc).__name__}): choose a writable location"
        ) from None
    os.close(fd)
    os.unlink(tmp)
    return p


@dataclass(frozen=True)
class BoundaryRule:
    """Where the first reasoning stage ends: the end of a marker's first occurrence, or a token offset.

    ``tokens:`` is reserved for offsets: ``tokens:-1`` or ``tokens:abc`` is an error, never a marker.
    """

    marker: str | None = None
    tokens: int | None = None

    @classmethod
    def parse(cls, text: str) -> BoundaryRule:
        if text == "":
            raise KvauditError("--kvaudit-boundary is empty: give a marker string such as '</think>' or tokens:K")
        head, sep, rest = text.strip().partition(":")
        if sep and head == "tokens":
            if not re.fullmatch(r"[0-9]{1,9}", rest.strip()) or int(rest) < 1:
                raise KvauditError(
                    f"boundary {text!r}: tokens:K needs a whole number K >= 1 (the prefix must end in a generated "
                    "token), e.g. tokens:8"
                )
            return cls(tokens=int(rest))
        return cls(marker=text)

    def describe(self) -> str:
        return f"tokens:{self.tokens}" if self.tokens is not None else f"marker {self.marker!r}"


#: AuditConfig fields that decide what is computed, beside the model and the item set
WORK_FIELDS = ("backend", "n", "dtypes", "attn", "attn_axes", "chunks", "donor_max_units", "sweep_units", "batch_size",
               "batch_units", "tf32", "device_map", "chat_template", "threads", "work", "exact_items")


@dataclass(frozen=True)
class AuditConfig:
    """Everything that decides what a run computes. Two runs with equal configs compute the same cells."""

    model: str = str(EMBEDDED_DIR)
    #: the engine that runs the model, by name: data (the ledger and the report write it); what runs is
    #: :attr:`engine`, its record
    backend: str = "transformers"
    items: str | None = None
    n: int | None = None
    dtypes: tuple[str, ...] = ("bf16", "fp32")
    device: str = "auto"
    attn: str | None = None
    boundary: str | None = None
    answer_regex: str | None = None
    max_new_tokens: int | None = None
    stop_regex: str | None = None  # None: the item set's; "off": none
    seed: int = 0
    chunks: tuple[int, ...] = ()
    donor_max_units: int = 64
    sweep_units: int = 8  # divergent items (per shard) that also get the layer sweep
    attn_axes: tuple[str, ...] = ()  # further attention implementations, compared as axis rows
    cache_axes: tuple[str, ...] = ()  # further cache layouts (static) beside the dynamic one, as axis rows
    batch_size: int = 4  # batch invariance: the item inside a left-padded batch of this size
    batch_units: int = 8  # ... for the first this many items of the set (0: off)
    #: the replicas and the bridge (the exact claims' own work) on the first this many items of the set (None: all)
    exact_items: int | None = None
    tf32: bool | None = None  # None: leave torch's TF32 switches as they are
    device_map: str | None = None  # e.g. "auto": spread a checkpoint bigger than one GPU (accelerate)
    trust_remote_code: bool = False
    allow_pickle: bool = False
    chat_template: bool | None = None  # None: auto, the template when the checkpoint ships one (engine/chat.py)
    threads: int | None = None
    #: ``--kvaudit-engine-arg KEY=VALUE`` pairs, passed to the engine as given (vLLM's ``LLM``), sorted by key
    engine_args: tuple[tuple[str, str], ...] = ()
    snapshots: str | None = None  # folder of recorded ledgers (default: snapshots/ under the rootdir)
    ledger_tokens_only: bool = False  # audit ledgers on token-level fields only (a cross-machine audit)
    #: what the selected claims need (:func:`.pipeline.work_of`): None computes everything (every built-in claim,
    #: or a test that reads the store without declaring what it reads)
    work: tuple[str, ...] | None = None
    #: the record of :attr:`backend`, resolved once when the config is built (``--kvaudit-backend`` at configure):
    #: every computation reads the engine through it, never by name
    engine: Engine = field(default=cast(Engine, None), compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.engine is None or self.engine.name != self.backend:
            object.__setattr__(self, "engine", engines.engine(self.backend))
        # what the backend cannot do is neither run nor priced (the report names it): a whole-state engine has no
        # layers to sweep, a one-sequence context no batch to compare a row of; nor what no selected claim reads
        for field_name, what in (("sweep_units", "layer_sweep"), ("batch_units", "batch_invariance")):
            if what in self.engine.lacks or not computes(self.work, what):
                object.__setattr__(self, field_name, 0)

    def computes(self, what: str) -> bool:
        """Whether this run computes ``what`` (a group, analysis or construction: :func:`.pipeline.computes`)."""
        return computes(self.work, what)

    def replace(self, **kw: object) -> AuditConfig:
        return dataclasses.replace(self, **kw)  # type: ignore[arg-type]

    @property
    def primary_dtype(self) -> str:
        """The precision whose trajectory fixes the prefix ids of the fixed-prefix 2x2."""
        return self.dtypes[0]

    def work_identity(self) -> dict[str, Any]:
        """What decides the work a run computes beyond the model and the item set: the fields of
        :data:`WORK_FIELDS` and the registered schedules every cell computes. Shards merged into one run must
        agree on it, and a plan's estimate is kept for the run that has it."""
        d = {k: getattr(self, k) for k in WORK_FIELDS}  # not asdict: the record is no data
        return {**{k: list(d[k]) if isinstance(d[k], tuple) else d[k] for k in WORK_FIELDS},
                "constructions": list(extra_constructions())}

    def items_path(self) -> Path:
        if self.items:
            return Path(self.items)
        model_dir = Path(self.model)
        if (model_dir / "items.jsonl").is_file():
            return model_dir / "items.jsonl"
        raise KvauditError(
            f"no item set for model {self.model!r}: pass --kvaudit-items=FILE.jsonl "
            "(lines with id, prompt or prompt_ids, answer)"
        )
