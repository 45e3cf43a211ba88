"""Where a store's items come from: all of them in one process, or a queue shared with other processes.

The store computes items in (precision, item) order and spends two budgets (the donor units and the layer
sweep's units) on the first divergent units in that order. :class:`WorkSource` is what the store asks of
whoever hands out the items; :mod:`pytest_kvaudit.workers.queue` implements it for xdist workers, so the
engine knows nothing of processes or files.
"""

from __future__ import annotations

from typing import Protocol


def within(granted: int, budgets: tuple[int, ...]) -> tuple[bool, ...]:
    """Whether each budget still has room after ``granted`` units."""
    return tuple(granted < b for b in budgets)


class LostItem(Exception):
    """The item's first-precision cell died with its worker: the item is missing from the run."""


class WorkSource(Protocol):
    """Items handed out one at a time to the processes of one run, by index into the store's items."""

    def take(self, phase: int) -> int | None:
        """The next item index of precision ``phase`` for this process, or None when there is none left."""

    def grant(self, phase: int, index: int, budgets: tuple[int, ...]) -> tuple[bool, ...]:
        """For a divergent unit: whether each budget still has room, counting every unit before it."""

    def prefix(self, index: int, phase: int = 0) -> tuple[int, ...] | None:
        """The first precision's prefix of item ``index`` (None: ineligible); :class:`LostItem` if it died."""

    def done(self, phase: int, index: int, flagged: bool, prefix: tuple[int, ...] | None = None) -> None:
        """Publish a computed unit: whether it spent a budget unit, and (first precision) its prefix."""
