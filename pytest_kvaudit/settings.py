"""What a run is asked (:class:`Settings`, fixed at configure) and which claims it judges (:class:`Selection`, made
after collection): two of the session's jobs (:mod:`pytest_kvaudit.session`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_kvaudit.selection import selected_claims

if TYPE_CHECKING:
    from pytest_kvaudit.claims.base import Claim

#: where an xdist worker ships its selection to the controller (``workeroutput``)
SELECTION_KEY = "kvaudit_selection"


@dataclass(frozen=True)
class Settings:
    """What the run is asked, read once at configure. The run's config, which its selection and a merge refine,
    lives beside the store it opens (:class:`pytest_kvaudit.workers.lifecycle.Lifecycle`)."""

    thresholds: dict[str, dict[str, float]]
    #: the report's formats asked for: option -> path (:data:`pytest_kvaudit.report.writers.WRITERS`)
    outputs: dict[str, Path] = field(default_factory=dict)
    baseline: str | None = None
    strict: bool = False  # --kvaudit-strict: inconclusive is a failure
    plan_only: bool = False  # --kvaudit-plan: price the run, compute nothing beyond the calibration
    analyses: tuple[str, ...] = ()  # --kvaudit-analyses: computed whatever the claims


@dataclass
class Selection:
    """The claims the run judges: what ``--kvaudit-claims`` asks, and what the collection holds."""

    asked: tuple[str, ...] | None = None  # --kvaudit-claims: None, ("all",), () or names
    collected: set[str] | None = None  # claims this process collected (None: it collected nothing)
    undeclared: list[str] = field(default_factory=list)  # tests reading the store without a registered claim

    def claims(self) -> list[Claim]:
        """The registered claims this run judges (collected, after ``-k`` and ``--kvaudit-claims``), and a
        claim that declares nothing for each test that reads the store without one (it gets everything)."""
        return selected_claims(self.asked, self.collected, self.undeclared)
