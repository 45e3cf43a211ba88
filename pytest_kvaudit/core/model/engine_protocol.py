"""What the audit needs of a model engine, as a ``Protocol`` (compare pytest-xdist's ``scheduler/protocol.py``).

A backend is one model loaded at one precision with its identity. The decoder
(:mod:`pytest_kvaudit.core.runtime.decoder`) counts every forward and applies the fault hooks around these calls, so a
backend only runs them; the state it hands out is whatever the engine keeps between forwards (transformers' ``Cache``),
and the state adapters (:mod:`pytest_kvaudit.core.runtime.state`) are what read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol


@dataclass(frozen=True)
class OpenSpec:
    """What opening a model takes, as one value: the seven settings used to travel as loose positional
    arguments through four calls (store -> engine registry -> engine -> loader), and each new setting meant
    editing all four. ``engine_args`` are an engine's own settings, passed through untouched (empty by default)."""

    model: str
    dtype: str
    device: str = "auto"
    attn: str | None = None
    trust_remote_code: bool = False
    allow_pickle: bool = False
    device_map: str | None = None
    engine_args: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


class Backend(Protocol):
    """One model at one precision on one device."""

    #: checkpoint identity: id, architecture, num_layers, weights_digest (what a ledger is keyed on)
    identity: dict[str, Any]
    dtype: str
    device: str
    attn_implementation: str
    tokenizer: Any
    eos_ids: frozenset[int]
    vocab_size: int
    #: prompt + generation longer than this is ineligible (too_long); None when the model has no limit
    max_positions: int | None

    def encode(self, text: str) -> list[int]:
        """Text -> ids, with the tokenizer's special tokens (a prompt)."""

    def decode(self, ids: Sequence[int]) -> str:
        """Ids -> text, special tokens kept (for labels and people; never re-encoded)."""

    def fresh(self, kind: str = "dynamic", max_len: int | None = None) -> Any:
        """An empty state of layout ``kind`` (a static one preallocated to ``max_len`` positions)."""

    def step(self, ids: Sequence[int], state: Any) -> Any:
        """Feed one chunk of ``ids`` on top of ``state`` (mutated); the next-token logits, shape ``[vocab]``."""

    def step_batch(self, rows: Sequence[Sequence[int]], pad: int) -> Any:
        """A fresh state over ``rows`` left-padded with ``pad`` into one batch, in one forward."""

    def shape(self) -> dict[str, int]:
        """layers, kv_heads, head_dim, parameters, and whether any layer carries recurrent state."""
