"""A counterexample for people: where two continuations of one unit part, and what each said there."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.claims.analyses import first_divergence
from pytest_kvaudit.core.model.records import CellRecord


def detail(rec: CellRecord, a_name: str, a: Any, b_name: str, b: Any, **extra: Any) -> dict[str, Any]:
    """One counterexample for people: where continuation ``a`` and ``b`` (anything with ``suffix``,
    ``margins`` and ``text``) of ``rec`` part, the top-2 margin there under each, and both as text."""
    j = first_divergence(a.suffix, b.suffix)

    def margin(c: Any) -> float | None:
        m = getattr(c, "margins", ())
        return m[j] if j is not None and j < len(m) else None

    return {"unit": f"{rec.item_id}@{rec.dtype}", "item": rec.item_id, "dtype": rec.dtype, "a": a_name, "b": b_name,
            "position": j, "margin_a": margin(a), "margin_b": margin(b), "text_a": getattr(a, "text", ""),
            "text_b": getattr(b, "text", ""), **extra}
