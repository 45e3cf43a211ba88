"""What a cell leaves behind: typed, plain records (ids, suffixes, labels, fingerprints, outcomes).

:class:`CellRecord` is one item at one precision; its parts say what they hold: the trajectory's ids,
one :class:`Continuation` per construction, the 2x2's own cells, the :class:`Transplant`
outcomes with their controls, the :class:`Comparison` of the boundary states and the :class:`Probes`.
They pickle and JSON-serialise, so xdist workers and shards ship them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_kvaudit.core.model.digests import fingerprint_ids

#: ineligible: prompt + max_new_tokens exceed the model's position limit
TOO_LONG = "too_long"
#: how much of a generation that missed its boundary the report shows
TAIL_TOKENS, TAIL_CHARS = 48, 120


#: what a transplant is for: the donor's K/V (the claim and the sweep), or one of the two controls
DONOR, SHAM, IDENTICAL = "donor", "sham", "identical"


@dataclass(frozen=True)
class Continuation:
    """What one boundary state led to: the suffix ids and the fingerprints of everything on the way."""

    suffix: tuple[int, ...]
    state_fp: str
    logits_fp: str
    answer: str | None
    label: bool
    #: top-1 minus top-2 logit at each suffix step (float32): near-tie evidence for the anatomy
    margins: tuple[float, ...] = ()
    #: the suffix decoded to text, for people reading counterexamples (never compared)
    text: str = ""
    #: tokens the engine took from its own prompt cache to build this state (``warm``: the proof of the hit);
    #: None for every construction built by forwards alone
    reused: int | None = None

    @property
    def suffix_fp(self) -> str:
        return fingerprint_ids(self.suffix)

    def same_as(self, other: Continuation) -> bool:
        """Bit-identical: suffix, boundary state and every logits vector on the way."""
        return (self.suffix, self.state_fp, self.logits_fp) == (other.suffix, other.state_fp, other.logits_fp)


@dataclass
class Transplant:
    """A receiver continued from its donor's K/V at the boundary."""

    direction: str  # "<donor>_to_<receiver>": live_to_prefill, prefill_to_live; a sham's is prefill_to_prefill
    layers: tuple[int, ...] | None  # None = all layers
    parts: str  # "kv", "k" or "v"
    suffix: tuple[int, ...]
    followed: bool  # receiver's suffix equals the donor's, token for token
    #: donor (the claim's transplant and the sweep's subsets), sham or identical (the controls)
    kind: str = DONOR
    #: the receiver's suffix is its own untransplanted one, token for token (a control must keep this)
    held: bool = False
    margins: tuple[float, ...] = ()
    text: str = ""
    #: decoding stopped at the first token that departed from the donor's suffix (a sweep point: only whether
    #: it follows is asked, and that was decided there); ``suffix`` and ``text`` end at that token
    stopped: bool = False

    @property
    def whole(self) -> bool:
        """The all-layer K and V transplant that donor_following judges (the rest are the layer sweep)."""
        return self.kind == DONOR and self.layers is None and self.parts == "kv"

    @property
    def receiver(self) -> str:
        return self.direction.rsplit("_to_", 1)[-1]

    @property
    def donor(self) -> str:
        return self.direction.split("_to_", 1)[0]


@dataclass
class Comparison:
    """The live boundary state set against the others, layer by layer."""

    #: layers whose K or V differ between the incremental replay and the live cache ("3:k", "3:v")
    bridge_mismatch: list[str] = field(default_factory=list)
    #: per layer [layer, K max-abs, V max-abs, K relative, V relative] between live and prefill states
    drift: list[list[float]] = field(default_factory=list)
    #: the decoded tokens where live and prefill first part, for people reading the anatomy
    divergence_text: list[str] = field(default_factory=list)
    #: layers whose K or V differ (not bit-identical) between the live and prefill states, and the rest
    differing_layers: list[int] = field(default_factory=list)
    identical_layers: list[int] = field(default_factory=list)
    #: an engine whose blocks are read per position (vLLM): where two states first part, per pair compared
    #: ("live_vs_prefill": layer, part, position, block, ULPs there and in the layer), None where bit-identical
    first_difference: dict[str, Any] = field(default_factory=dict)


@dataclass
class Probes:
    """Outcomes of the per-precision probes beyond the claims (see :mod:`pytest_kvaudit.core.compute.probes`)."""

    axes: dict[str, dict[str, Any]] = field(default_factory=dict)  # attention implementation -> outcome
    batch: dict[str, Any] = field(default_factory=dict)  # batch invariance outcome
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)  # cache layout (static) -> outcome


@dataclass
class CellRecord:
    """One item at one precision: the trajectory, every construction's continuation, the transplants."""

    item_id: str
    dtype: str
    prompt_ids: tuple[int, ...]
    generated: tuple[int, ...]
    boundary: int | None
    reason: str | None  # why the item is ineligible
    answer: str
    constructions: dict[str, Continuation] = field(default_factory=dict)
    #: the fixed-prefix 2x2's own cells ("replay", "prefill") at this precision on the first precision's
    #: prefix ids, computed on fresh caches (also when this precision's trajectory was ineligible)
    fixed: dict[str, Continuation] = field(default_factory=dict)
    fixed_prefix_fp: str | None = None
    fixed_prefix_len: int | None = None
    transplants: list[Transplant] = field(default_factory=list)
    comparison: Comparison = field(default_factory=Comparison)
    probes: Probes = field(default_factory=Probes)
    unsupported: str | None = None  # why K/V operations do not apply to this model
    error: str | None = None  # an error on this item alone (out of memory), the run went on
    #: the end of what the model generated, decoded, when it never reached the boundary (for the report)
    generated_tail: str | None = None
    #: an engine whose constructions are requests (vLLM): per construction, the proof of what the engine did
    #: (num_cached_tokens, prefill chunks, the batch it ran in; the whole-block hit's boundary and verdict)
    requests: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def eligible(self) -> bool:
        return self.reason is None and self.error is None

    @property
    def prefix(self) -> tuple[int, ...]:
        assert self.boundary is not None
        return self.prompt_ids + self.generated[: self.boundary]

    @property
    def prefix_fp(self) -> str:
        return fingerprint_ids(self.prefix)

    @property
    def bridge_mismatch(self) -> list[str]:
        return self.comparison.bridge_mismatch

    @property
    def drift(self) -> list[list[float]]:
        return self.comparison.drift

    def whole_transplants(self) -> list[Transplant]:
        return [t for t in self.transplants if t.whole]

    def controls(self, kind: str) -> list[Transplant]:
        """donor_following's controls of one ``kind`` (sham or identical) on this record."""
        return [t for t in self.transplants if t.kind == kind]

    @property
    def recurrence_comparable(self) -> bool:
        """This precision's own prefix is the 2x2's fixed prefix, id for id: its matched live-vs-prefill
        comparison and the 2x2's replay-vs-prefill comparison are over the same ids."""
        return self.eligible and bool(self.fixed) and self.fixed_prefix_fp == self.prefix_fp

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellRecord:
        d = dict(d)
        d["prompt_ids"] = tuple(d["prompt_ids"])
        d["generated"] = tuple(d["generated"])
        d["constructions"] = {k: _cont(v) for k, v in d["constructions"].items()}
        d["fixed"] = {k: _cont(v) for k, v in d["fixed"].items()}
        d["transplants"] = [
            Transplant(**{**t, "suffix": tuple(t["suffix"]), "layers": None if t["layers"] is None
                          else tuple(t["layers"]),
                          "margins": tuple(t.get("margins", ()))})
            for t in d["transplants"]
        ]
        d["comparison"] = Comparison(**d["comparison"])
        d["probes"] = Probes(**d["probes"])
        return cls(**d)


def _cont(v: dict[str, Any]) -> Continuation:
    return Continuation(**{**v, "suffix": tuple(v["suffix"]), "margins": tuple(v.get("margins", ()))})

