"""What a claim is: its name, thresholds, least evidence, pass rule and how it shows itself.

A claim is a subclass of :class:`Claim` registered with :func:`register`. The built-in claims (one module
each in this package) register themselves through the same decorator that a user's claim uses in their
own test file, and nothing else in kvaudit spells a claim's name: the report, the terminal table and the
HTML read everything from the claim object or from the result it produced. Pure data and functions, no
pytest, so a claim can be judged from a saved store export.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from ..errors import KvauditError
from ..stats import wilson_interval

if TYPE_CHECKING:
    from ..cells import CellRecord
    from ..config import AuditConfig

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
#: where a claim without an ``order`` sorts: after the paper's claims, then by name
USER_ORDER = 1000


@dataclass
class ClaimResult:
    """One verdict: ``k`` of ``n`` units hold, a 95% interval, the reason and the claim's figures."""

    name: str
    status: str
    n: int
    k: int
    interval: tuple[float, float]
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)
    counterexamples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["interval"] = [round(x, 6) for x in self.interval]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ClaimResult:
        return cls(**{**d, "interval": tuple(d["interval"])})


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
    #: the least evidence the claim needs, in words (the thresholds hold the numbers)
    evidence: ClassVar[str] = ""
    #: names of keyword inputs the claim's test passes to ``kvaudit_judge.claim`` (e.g. ``snapshot``)
    inputs: ClassVar[tuple[str, ...]] = ()

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

    def judge(self, ev: Evidence) -> ClaimResult:
        raise NotImplementedError

    def key_figure(self, result: ClaimResult) -> str:
        """The table's figure column, in the paper's phrasing; the reason by default."""
        return result.reason

    def rates(self, figures: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
        """Rates (k, n) that a baseline comparison watches for leaving their 95% interval."""
        return {}

    def html(self, result: Mapping[str, Any], run: Mapping[str, Any]) -> str | None:
        """An HTML section of its own (tables, figures) beside the claims table; none by default."""
        return None

    def display(self, result: ClaimResult) -> dict[str, Any]:
        """What renderers need without the claim's code: order, title, key figure and watched rates."""
        return {"order": self.order, "title": self.title or self.name, "figure": self.key_figure(result),
                "rates": {k: list(v) for k, v in self.rates(result.figures).items()}}

    def result(self, status: str, n: int, k: int, reason: str, figures: dict[str, Any] | None = None,
               counterexamples: list[str] | None = None, interval: tuple[float, float] | None = None) -> ClaimResult:
        """A result of this claim, with a Wilson interval on k/n unless another is given."""
        return ClaimResult(self.name, status, n, k, wilson_interval(k, n) if interval is None else interval, reason,
                           figures or {}, counterexamples or [])


_REGISTRY: dict[str, Claim] = {}
C = TypeVar("C", bound=type[Claim])


def register(cls: C) -> C:
    """Class decorator: make ``cls`` a claim that ``kvaudit_judge.claim(cls.name)`` judges."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise KvauditError(f"claim class {cls.__qualname__} needs a class attribute name = 'an_identifier'")
    _REGISTRY[name] = cls()
    return cls


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
    s = list(statuses)
    if FAIL in s:
        return FAIL
    if not s or INCONCLUSIVE in s:
        return INCONCLUSIVE
    return PASS


def ineligible_note(records: list[CellRecord]) -> str:
    bad = [r for r in records if not r.eligible]
    if not bad:
        return ""
    reasons: dict[str, int] = {}
    for r in bad:
        key = r.error or r.reason or "?"
        reasons[key] = reasons.get(key, 0) + 1
    return " (ineligible: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) + ")"


def exact_result(name: str, units: Mapping[str, bool], min_units: int = 1, reason: str = "") -> ClaimResult:
    """An exactness verdict over named units: fails on one counterexample, inconclusive below ``min_units``."""
    bad = [u for u, ok in units.items() if not ok]
    n, k = len(units), len(units) - len(bad)
    status = FAIL if bad else INCONCLUSIVE if n < min_units else PASS
    why = f"fails on {', '.join(bad[:8])}" if bad else f"{n} units, needs {min_units}" if n < min_units else f"holds on {k}/{n}"
    return ClaimResult(name, status, n, k, wilson_interval(k, n), reason or why, {}, bad)
