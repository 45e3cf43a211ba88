"""What a claim is: its name, thresholds, least evidence, pass rule and how it shows itself.

A claim is a subclass of :class:`Claim` registered with :func:`register`. The built-in claims (one module
each in this package) register themselves through the same decorator that a user's claim uses in their
own test file, and nothing else in kvaudit spells a claim's name: the report, the terminal table and the
HTML read everything from the claim object or from the result it produced. Pure data and functions, no
pytest, so a claim can be judged from a saved store export.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pytest_kvaudit.claims.stats import wilson_interval
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import lacked

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.cells import CellRecord
    from pytest_kvaudit.core.model.config import AuditConfig

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: where a claim without an ``order`` sorts: after the paper's claims, then by name
USER_ORDER = 1000


def finite(value: Any) -> Any:
    """``value`` with every infinite or NaN float replaced by None (JSON has no infinities)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


NO_INTERVAL = (math.nan, math.nan)  # a statistic over no units: null in JSON, a dash in the table


@dataclass
class ClaimResult:
    """One verdict: ``k`` of ``n`` units hold, a 95% interval, the reason and the claim's figures.

    ``counterexamples`` names the units (``item@dtype ...``); ``details`` carries one dict per
    counterexample for people reading it: ``unit``, ``item``, ``dtype``, the two continuations compared
    (``a``, ``b``), the first differing suffix ``position``, the top-2 margin there under each
    (``margin_a``, ``margin_b``) and both continuations as decoded text (``text_a``, ``text_b``)."""

    name: str
    status: str
    n: int
    k: int
    interval: tuple[float, float]
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    counterexamples: list[str] = field(default_factory=list)
    details: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = finite(asdict(self))
        d["interval"] = [None if x is None else round(x, 6) for x in d["interval"]]
        return d  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClaimResult:
        iv = tuple(math.nan if x is None else float(x) for x in d["interval"])
        return cls(**{**d, "interval": iv})


@dataclass(frozen=True)
class Threshold:
    """A claim's tunable: its default, what it means and in which unit (shown in docs and the plan)."""

    default: float
    meaning: str
    unit: str = ""


@dataclass
class Evidence:
    """What a claim judges: the run's records, its resolved thresholds and config, and any inputs (fixtures
    such as syrupy's ``snapshot``) that the claim's test handed over."""

    records: list[CellRecord]
    thresholds: dict[str, float]
    config: AuditConfig
    store: Any = None
    inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def dtypes(self) -> tuple[str, ...]:
        return self.config.dtypes

    def eligible(self) -> list[CellRecord]:
        return [r for r in self.records if r.eligible]


class Claim:
    """Subclass, set the class attributes, implement :meth:`judge`, and decorate with :func:`register`."""

    name: ClassVar[str]
    #: the paper's order for the built-ins; user claims sort after them by name
    order: ClassVar[int] = USER_ORDER
    #: a heading for the HTML section
    title: ClassVar[str] = ""
    #: every tunable with its default; a ``kvaudit_claim`` marker or an ini line overrides any of them
    thresholds: ClassVar[dict[str, Threshold]] = {}
    #: the least evidence the claim needs, in words (the thresholds hold the numbers; :meth:`least_evidence` says them)
    evidence: ClassVar[str] = ""
    #: names of keyword inputs the claim's test passes to ``kvaudit_judge.claim`` (e.g. ``snapshot``)
    inputs: ClassVar[tuple[str, ...]] = ()
    #: what the engine must compute for this claim: groups of the cell's steps
    #: (:data:`pytest_kvaudit.core.model.pipeline.GROUPS`: trajectory, replicas, constructions, fixed, transplants,
    #: controls) or one construction by name (``prefill``, ``incremental``, ``chunked(4)``), priced on :meth:`units`;
    #: also an analysis it reads (``layer_sweep``, ``batch_invariance``: never priced) or ``per_layer`` (per-layer K/V,
    #: which a backend may lack). A run
    #: that selects claims computes what their needs name and nothing else (the trajectory and the prefill
    #: always); the union of the selected claims' needs is the least work, the denominator of the run's
    #: overhead figure. None (the default): the claim did not say, so it gets everything.
    needs: ClassVar[tuple[str, ...] | None] = None
    #: analyses the claim's figures quote beside its verdict (donor_following: the layer sweep), computed when
    #: the claim is selected and the backend can, never counted in its least work
    analyses: ClassVar[tuple[str, ...]] = ()
    #: an exactness claim: bit-identical or not. Such a claim never judges a lossy cache kind (a quantized
    #: cache is lossy by design); its result says which kinds it left to their budget (:func:`.notes.lossy_note`)
    exact: ClassVar[bool] = False

    def applicable(self, config: AuditConfig) -> str | None:
        """Why this claim has nothing to judge in a run of ``config`` (its test skips, saying so, before any
        verdict: not inconclusive, so ``--kvaudit-strict`` does not fail on it); None when it applies. By
        default: a need the run's backend lacks (the llama.cpp backend has no per-layer K/V to sweep)."""
        missing = lacked(config.engine, self.needs or ())
        return f"the {config.engine.name} backend cannot compute {', '.join(missing)}" if missing else None

    def strict_needs(self, thresholds: Mapping[str, float], rates: Mapping[str, float]) -> dict[str, int | None]:
        """Items (``--kvaudit-n``) the claim needs to decide beyond its least-evidence counts, at the rates a
        plan expects per item (``divergent_rate_max``...): none by default
        (:func:`pytest_kvaudit.core.planning.plan.strict_n` turns the counts of :meth:`least_evidence` into items
        itself)."""
        return {}

    def verdict_chance(self, n: int, discordance: float, thresholds: Mapping[str, float]) -> float | None:
        """The chance that this claim's statistical rule reaches a verdict (pass or fail) on ``n`` units of one
        precision when a share ``discordance`` of them disagree and nothing truly moves, computed on the rule
        itself (:mod:`pytest_kvaudit.claims.power`); None (the default) for a claim that decides on counts alone."""
        return None

    def rejudge(self, result: Mapping[str, Any], thresholds: Mapping[str, float]) -> ClaimResult | None:
        """A committed report's result (``result``, as the JSON holds it) judged again from the counts it
        recorded by today's rules, with ``thresholds``; None (the default) for a claim whose recorded verdict
        stands, its rule unchanged since (:data:`pytest_kvaudit.claims.rules.RULES_VERSION`) or not a statistic
        of its counts."""
        return None

    def recorded_run(self, config: AuditConfig) -> Path | None:
        """A file in which an earlier run of this model recorded its lengths (a ledger), for the plan to price
        the run on; None by default."""
        return None

    def units(self, records: list[CellRecord], config: AuditConfig) -> list[CellRecord]:
        """The records whose ``needs`` are this claim's work: all by default (a claim judging a subset, such as
        the first divergent units, narrows it)."""
        return records

    def defaults(self, config: AuditConfig) -> dict[str, float]:
        """Threshold defaults, some of which may come from the run's config."""
        return {k: t.default for k, t in self.thresholds.items()}

    def resolve(self, config: AuditConfig, *layers: Mapping[str, Any]) -> dict[str, float]:
        """Defaults, then each layer of overrides in turn (marker, ini, call); unknown keys are an error."""
        th = self.defaults(config)
        for layer in layers:
            for k, v in layer.items():
                if k not in th:
                    raise KvauditError(f"claim {self.name} has no threshold {k!r}; it has {', '.join(th)}")
                try:
                    th[k] = float(v)
                except (TypeError, ValueError):
                    raise KvauditError(f"claim {self.name}: threshold {k}={v!r} is not a number") from None
        return th

    def least_evidence(self, thresholds: Mapping[str, float]) -> dict[str, float | None]:
        """The least evidence below which the claim is inconclusive, as numbers a plan can set against what
        it will compute: ``{what: amount}`` (units, or a rate such as ``label_rate``). By default the
        ``min_units`` threshold, when the claim has one."""
        return {"units": int(thresholds["min_units"])} if "min_units" in thresholds else {}

    def statistic(self, result: ClaimResult) -> str:
        """What the result's interval is, named for the table's statistic column."""
        conf = result.figures.get("confidence", 0.95) if isinstance(result.figures, Mapping) else 0.95
        return f"Wilson {conf:.0%} CI of k/n"

    def judge(self, ev: Evidence) -> ClaimResult:
        raise NotImplementedError

    def key_figure(self, result: ClaimResult) -> str:
        """The table's figure column, in the paper's phrasing; the reason by default."""
        return result.reason

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        """Rates (k, n) that a baseline comparison watches for leaving their 95% interval."""
        return {}

    def comparable(self, result: ClaimResult) -> bool:
        """Whether this verdict speaks for the checkpoint, so that a baseline gate compares it with the next
        checkpoint's (a verdict about a recorded ledger's presence does not)."""
        return True

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        """An HTML section of its own (tables, figures) beside the claims table; none by default."""
        return None

    def display(self, result: ClaimResult) -> dict[str, Any]:
        """What renderers need without the claim's code: order, title, key figure and watched rates."""
        return {"order": self.order, "title": self.title or self.name, "figure": self.key_figure(result),
                "statistic": self.statistic(result), "comparable": self.comparable(result),
                "rates": {k: list(v) for k, v in self.rates(result.figures).items()}}

    def result(self, status: str, n: int, k: int, reason: str, figures: dict[str, Any] | None = None,
               counterexamples: list[str] | None = None, interval: tuple[float, float] | None = None,
               details: list[dict[str, Any]] | None = None) -> ClaimResult:
        """A result of this claim, with a Wilson interval on k/n unless another is given (none at n = 0)."""
        if interval is None:
            interval = wilson_interval(k, n) if n else NO_INTERVAL
        return ClaimResult(self.name, status, n, k, interval, reason, figures or {}, counterexamples or [],
                           details or [])


_REGISTRY: dict[str, Claim] = {}
C = TypeVar("C", bound=type[Claim])


def register(cls: C) -> C:
    """Class decorator: make ``cls`` a claim that ``kvaudit_judge.claim(cls.name)`` judges."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise KvauditError(f"claim class {cls.__qualname__} needs a class attribute name = 'an_identifier'")
    _REGISTRY[name] = cls()
    return cls


def least_units(claim: Claim | str, thresholds: Mapping[str, Any] | None = None,
                config: AuditConfig | None = None) -> dict[str, float | None]:
    """What ``claim`` needs to decide, with its default thresholds (from ``config`` where they depend on it)
    overridden by ``thresholds``: ``{what: amount}``, as :meth:`Claim.least_evidence` says it."""
    c = get(claim) if isinstance(claim, str) else claim
    return c.least_evidence(c.resolve(config or AuditConfig(), thresholds or {}))


def get(name: str) -> Claim:
    if name not in _REGISTRY:
        raise KvauditError(f"unknown claim {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def registered() -> list[Claim]:
    """Every registered claim, in display order."""
    return sorted(_REGISTRY.values(), key=lambda c: (c.order, c.name))


def names(units: Iterable[str], limit: int = 8) -> str:
    u = list(units)
    return ", ".join(u[:limit]) + (f" and {len(u) - limit} more" if len(u) > limit else "")


def combine(statuses: Iterable[str]) -> str:
    """A claim's verdict from its parts: FAIL when any part fails, PASS when every part passes, else
    inconclusive. So a claim's PASS size is one part's (every part must pass), and its FAIL size is up to the sum
    of its parts': a statistical rule judges each FAIL part at alpha split over the parts
    (:mod:`pytest_kvaudit.claims.rules`), keeping the claim's FAIL size at most alpha."""
    s = list(statuses)
    if FAIL in s:
        return FAIL
    if not s or INCONCLUSIVE in s:
        return INCONCLUSIVE
    return PASS


def exact_result(name: str, units: Mapping[str, bool], min_units: int = 1, reason: str = "") -> ClaimResult:
    """An exactness verdict over named units: fails on one counterexample, inconclusive below ``min_units``."""
    bad = [u for u, ok in units.items() if not ok]
    n, k = len(units), len(units) - len(bad)
    status = FAIL if bad else INCONCLUSIVE if n < min_units else PASS
    why = (f"fails on {', '.join(bad[:8])}" if bad else f"{n} units, needs {min_units}" if n < min_units
           else f"holds on {k}/{n}")
    return ClaimResult(name, status, n, k, wilson_interval(k, n) if n else NO_INTERVAL, reason or why, {}, bad)
