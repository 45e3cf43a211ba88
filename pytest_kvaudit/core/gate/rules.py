"""The checkpoint gate's rules (``--kvaudit-baseline-fail``): which movements between a baseline and a run fail
the gate. One-sided by default, so that less divergence is an improvement and never a regression. Pure data, no
pytest, no torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pytest_kvaudit.core.errors import KvauditError

FLAG = "--kvaudit-baseline-fail"
#: metric -> the directions a rule may name for it
DIRECTIONS: dict[str, tuple[str, ...]] = {
    "divergence": ("increase", "decrease", "change"),
    "labels": ("increase", "decrease", "change"),
    "trajectories": ("change",),
    "continuations": ("change",),
    "verdicts": ("worse", "change"),
}
DEFAULT_RULES = "divergence:increase,labels:increase,trajectories:change,verdicts:worse"


@dataclass(frozen=True)
class Rules:
    """Metric -> direction that fails the gate (a metric not named only reports)."""

    fail: Mapping[str, str]

    @classmethod
    def parse(cls, text: str | None, where: str = FLAG) -> Rules:
        """``divergence:increase,labels:increase,trajectories:change,verdicts:worse`` or ``none``."""
        text = DEFAULT_RULES if text is None else text
        parts = [p.strip() for p in text.split(",") if p.strip()]
        usage = ("use METRIC:DIRECTION,... with " + ", ".join(f"{m}:{'|'.join(d)}" for m, d in DIRECTIONS.items())
                 + f", or none (default: {DEFAULT_RULES})")
        if parts == ["none"]:
            return cls({})
        if not parts:
            raise KvauditError(f"{where} is empty: {usage}")
        fail: dict[str, str] = {}
        for p in parts:
            metric, sep, direction = p.partition(":")
            if not sep or metric not in DIRECTIONS or direction not in DIRECTIONS[metric]:
                raise KvauditError(f"{where}: {p!r} is not a rule: {usage}")
            if metric in fail:
                raise KvauditError(f"{where}: {metric} is named twice ({metric}:{fail[metric]} and {p}): {usage}")
            fail[metric] = direction
        return cls(fail)

    def text(self) -> str:
        return ",".join(f"{m}:{d}" for m, d in self.fail.items()) or "none"

    def judge(self, metric: str, was: float, now: float, changed: bool = False) -> str | None:
        """``regression``, ``improvement`` or ``change`` for a metric that moved from ``was`` to ``now`` (a
        count or rate; ``changed`` for a same-count change of the set behind it), None when nothing moved."""
        if was == now and not changed:
            return None
        d = self.fail.get(metric)
        if d == "change" or (d == "increase" and now > was) or (d == "decrease" and now < was):
            return "regression"
        if (d == "increase" and now < was) or (d == "decrease" and now > was):
            return "improvement"
        return "change"

    def verdict(self, was: str, now: str) -> str | None:
        """The same for a claim's verdict: pass -> anything else is worse."""
        if was == now:
            return None
        d = self.fail.get("verdicts")
        if d == "change" or (d == "worse" and was == "pass"):
            return "regression"
        return "improvement" if now == "pass" else "change"
