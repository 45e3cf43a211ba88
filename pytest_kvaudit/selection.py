"""Which collected tests are kvaudit's and which claims they judge: read off the items (their fixtures and
``kvaudit_claim`` marks) without importing pytest, so the session and the interrupt handler share one rule."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any


def uses_store(item: Any) -> bool:
    """A kvaudit test: one that reads the store (``kvaudit_judge`` and ``kvaudit_records`` do)."""
    return "kvaudit_store" in getattr(item, "fixturenames", ())


def claims_of(readers: Sequence[Any], known: Collection[str]) -> tuple[set[str], list[str]]:
    """The registered claims that the store's readers judge (their ``kvaudit_claim`` marks), and the names
    of the readers that declare no registered claim (each gets a claim that reads everything)."""
    marked = {i.nodeid: n for i in readers if (m := i.get_closest_marker("kvaudit_claim")) and m.args
              and (n := str(m.args[0])) in known}
    return set(marked.values()), [i.name for i in readers if i.nodeid not in marked]


def selected_claims(selection: tuple[str, ...] | None, collected: set[str] | None,
                    undeclared: Sequence[str]) -> list[Any]:
    """The registered claims a run judges: those its tests collected (after ``-k``), else those
    ``--kvaudit-claims`` names (None, ``all`` or nothing: every one); and a claim that declares nothing for each
    test that reads the store without one (it gets everything). The claims load here: :func:`uses_store` is asked
    in every run, by the interrupt handler, and costs nothing."""
    from pytest_kvaudit.claims import Claim, registered

    claims = [c for c in registered() if (c.name in collected if collected is not None else
                                          selection in (None, ("all",), ()) or c.name in (selection or ()))]
    return claims + [Claim() for _ in undeclared]
