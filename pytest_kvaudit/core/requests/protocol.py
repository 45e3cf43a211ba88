"""What a request-level engine's backend offers the shared cell builder (:class:`.cells.RequestCellBuilder`): it
serves whole requests, each maybe teacher-forced over given ids and stopped by the item set's stop rule
(:class:`.stop.StopRow`), proves a prefix-cache hit by the count of cached prompt tokens it reports, and reads and
writes a request's K/V through the blocks it held (a block table). vLLM's ``VllmBackend`` is one; transformers'
continuous batching another."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_kvaudit.core.errors import KvauditError, UnsupportedCacheError
from pytest_kvaudit.core.model.items import token_text

__all__ = ["Done", "Hooks", "Request", "RequestBackend", "ServesRequests"]

#: one request: its prompt ids, ``max_tokens``, the ids it forces as decode steps, and optionally its stop rule
#: (:func:`.arithmetic.stop_rule`'s dict, read by :class:`.stop.StopRow`)
Request = tuple[Sequence[int], int, Sequence[int]] | tuple[Sequence[int], int, Sequence[int], Mapping[str, Any] | None]


@dataclass
class Done:
    """One finished request, as the audit reads it."""

    prompt_len: int
    tokens: tuple[int, ...]
    #: per generated token: the top-k (token id, raw logit) of the step, in rank order
    rows: list[list[tuple[int, float]]]
    cached: int  # num_cached_tokens: prompt tokens taken from the prefix cache
    blocks: list[int]  # the KV block ids it held, in position order
    #: tokens the scheduler gave it in each engine step, and how many requests that step ran
    steps: list[tuple[int, int]] = field(default_factory=list)

    @property
    def prefill_chunks(self) -> list[int]:
        """The engine steps that computed its prompt (past the cache hit): the chunked-prefill proof."""
        need, out = self.prompt_len - self.cached, []
        for n, _ in self.steps:
            if need <= 0:
                break
            out.append(n)
            need -= n
        return out

    @property
    def prefill_batch(self) -> int:
        """The most requests any of its prompt's steps ran with (batched(B): B + 1)."""
        k = len(self.prefill_chunks)
        return max((b for _, b in self.steps[:k]), default=0)


class Hooks(Protocol):
    """The engine's scheduler, as a transplant needs it."""

    #: called once with the first request's blocks between the call's first engine step and its second (its
    #: prefill done, its first decode step not yet run), then cleared: a transplant writes its state there
    between: Callable[[list[int]], None] | None


class RequestBackend(Protocol):
    """A request-level engine's backend: the forward-level ``Backend``'s identity, tokenizer and shape, plus
    requests served whole and their blocks read and written."""

    identity: dict[str, Any]
    dtype: str
    device: str
    tokenizer: Any
    eos_ids: frozenset[int]
    vocab_size: int
    max_positions: int | None
    #: positions per block (the prefix cache shares whole blocks only)
    block_size: int
    hooks: Hooks

    def reset(self) -> None:
        """Empty the prefix cache (every cold construction starts here)."""

    def run(self, requests: Sequence[Request], budget: int | None = None) -> list[Done]:
        """Serve ``requests`` together (in one batch where they fit; ``budget``: the scheduler's tokens per step);
        the first one's :class:`Done` first."""

    def read(self, blocks: Sequence[int], positions: int) -> Any:
        """The K/V of the first ``positions`` positions held in ``blocks`` (the record's state reader reads it)."""

    def write(self, blocks: Sequence[int], state: Any) -> None:
        """``state`` written over the positions it covers in ``blocks``."""

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: Sequence[int]) -> str: ...
    def shape(self) -> dict[str, int]: ...


class ServesRequests:
    """What every request-level backend says the same way, written once: it runs no forward on a caller's cache
    (the forward-level protocol's ``step``, ``fresh`` and ``step_batch`` are refused), its tokenizer encodes and
    decodes, and a read or write of ``positions`` needs that many positions' blocks. A backend sets ``engine``
    (its name, for messages), ``tokenizer`` and ``block_size``."""

    engine: str
    tokenizer: Any
    block_size: int

    def step(self, ids: Sequence[int], state: Any) -> Any:
        raise UnsupportedCacheError(f"the {self.engine} backend serves requests: it runs no forward on a caller's "
                                    "cache")

    fresh = step_batch = step

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return token_text(self.tokenizer, ids)

    def blocks_for(self, positions: int, blocks: Sequence[int], unit: str = "blocks") -> Sequence[int]:
        """The blocks that hold the first ``positions`` positions (a partial last one included), or one line saying
        the request held too few."""
        n = -(-positions // self.block_size)
        if n > len(blocks):
            raise KvauditError(f"{self.engine}: {positions} positions need {n} {unit}, the request held "
                               f"{len(blocks)}")
        return blocks[:n]
