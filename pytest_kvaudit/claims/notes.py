"""The lines a claim adds to its reason about units it did not judge: ineligible ones by reason (with the
chat template named where it is the likely cause), and the lossy cache kinds an exactness claim leaves to
their budget."""

from __future__ import annotations

from pytest_kvaudit.core.model.cache_kinds import is_lossy
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.records import CellRecord
from pytest_kvaudit.core.runtime.chat import checkpoint_source, missed_template_hint


def ineligible_note(records: list[CellRecord], config: AuditConfig | None = None) -> str:
    """The ineligible units by reason; where some never reached their boundary while the checkpoint's chat
    template was turned off, the template named as the likely cause."""
    bad = [r for r in records if not r.eligible]
    if not bad:
        return ""
    reasons: dict[str, int] = {}
    for r in bad:
        key = r.error or r.reason or "?"
        reasons[key] = reasons.get(key, 0) + 1
    hint = ""
    if config is not None and "boundary_not_reached" in reasons:
        hint = missed_template_hint(config.chat_template, checkpoint_source(config.model))
    return " (ineligible: " + ", ".join(f"{k} {v}" for k, v in sorted(reasons.items())) + hint + ")"


def lossy_note(config: AuditConfig) -> str:
    """What an exactness claim says of the run's lossy cache kinds: skipped, lossy by design ("" if none)."""
    kinds = [k for k in config.cache_axes if is_lossy(k)]
    return (f" (lossy cache kinds {', '.join(kinds)} skipped: lossy by design, audited against the exact cache "
            "within a label-change budget, never for exactness)") if kinds else ""


def exact_note(config: AuditConfig | None) -> str:
    """Where the run computed the replicas and the bridge on a head of the set only, say so ("" otherwise)."""
    n = getattr(config, "exact_items", None)
    return "" if n is None else f" (on the first {n} items of the set: --kvaudit-exact-items)"
