"""Decoding one forward at a time: boundary states from chunk schedules, the greedy trajectory and the
greedy continuation, with every forward counted.

The schedules themselves live in :mod:`pytest_kvaudit.core.model.schedules`. A continuation always starts by feeding
``prefix[-1]`` as one decode step, so two constructions differ only in the cache they hand over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import find_boundary
from pytest_kvaudit.core.model.schedules import schedule  # noqa: F401  (re-exported: the old home of schedule())
from pytest_kvaudit.core.runtime import state as kv


@dataclass
class Cost:
    """Forward calls and tokens actually run, counted where they run (the least the claims need is priced
    apart, from the claims' declared needs: :mod:`pytest_kvaudit.claims.needs`)."""

    forward_calls: int = 0
    forward_tokens: int = 0
    seconds: float = 0.0

    def merge(self, other: Cost) -> None:
        self.forward_calls += other.forward_calls
        self.forward_tokens += other.forward_tokens
        self.seconds += other.seconds


@dataclass(frozen=True)
class Faults:
    """Deliberate faults, to prove that each claim can fail. Each hook gets the *path* being computed: a
    construction's name (``live``, ``prefill``, ``incremental``, ``chunked(4)``), with ``:replica`` for
    its second computation, ``fixed:replay`` / ``fixed:prefill`` for the 2x2's own cells,
    ``transplant:<direction>`` (``live_to_prefill``, ``prefill_to_live``), ``transplant:sham:<receiver>`` and
    ``transplant:identical:<direction>`` for donor_following's controls, and ``axis:<attn>:live|prefill``.

    - ``logits(logits, path) -> logits`` on every forward's next-token logits;
    - ``state(cache, path)`` on every boundary state built from a schedule (mutate it in place);
    - ``transplant(receiver, donor, layers, parts) -> cache`` replaces :func:`cache.transplant`; the sham
      control calls it with the receiver's own cache as donor (``receiver is donor``).
    """

    logits: Callable[[Any, str], Any] | None = None
    state: Callable[[Any, str], None] | None = None
    transplant: Callable[[Any, Any, Any, str], Any] | None = None


NO_FAULTS = Faults()


class Decoder:
    """One model at one precision, run one forward at a time with its cost counted."""

    def __init__(self, backend: Any, eos_ids: frozenset[int] | None = None, cost: Cost | None = None,
                 faults: Faults = NO_FAULTS, cache_kind: str = "dynamic", max_cache_len: int | None = None) -> None:
        if not hasattr(backend, "step"):  # the core names no engine: the caller wraps a model in one
            raise KvauditError(f"Decoder takes a backend, not a {type(backend).__name__}: wrap a model in memory with "
                               "the transformers engine's TransformersBackend.of_model(model, eos_ids)")
        self.backend = backend
        self.eos_ids = backend.eos_ids if eos_ids is None else eos_ids
        self.cost = cost if cost is not None else Cost()
        self.faults = faults
        self.path = ""  # what is being computed, for the fault hooks
        #: the layout of every fresh cache: dynamic, or static preallocated to ``max_cache_len`` positions
        self.cache_kind, self.max_cache_len = cache_kind, max_cache_len
        #: the item set's stop rule over a suffix's ids (:func:`pytest_kvaudit.core.model.items.stopper`): a suffix ends
        #: at its first match
        self.stop: Callable[[Sequence[int]], bool] | None = None

    def step(self, ids: Sequence[int], cache: Any) -> Any:
        """Feed ``ids`` on top of ``cache`` (mutated); the next-token logits, shape ``[vocab]``."""
        logits = self.backend.step(ids, cache)
        self.cost.forward_calls += 1
        self.cost.forward_tokens += len(ids)
        if self.faults.logits is not None:
            logits = self.faults.logits(logits, self.path)
        return logits

    def step_batch(self, rows: Sequence[Sequence[int]], pad: int) -> Any:
        """A fresh state over ``rows`` left-padded into one batch, one forward (counted: every padded
        position is a token the model ran); the state fault hook sees it at the current path."""
        width = max(len(r) for r in rows)
        state = self.backend.step_batch(rows, pad)
        self.cost.forward_calls += 1
        self.cost.forward_tokens += width * len(rows)
        if self.faults.state is not None:
            self.faults.state(state, self.path)
        return state

    def fresh(self) -> Any:
        return self.backend.fresh(self.cache_kind, self.max_cache_len)

    @property
    def device(self) -> Any:
        """Where the backend computes (a torch device for transformers), for timing syncs."""
        dev = getattr(self.backend, "_device", None)
        return dev if dev is not None else self.backend.device

    def construct(self, name: str, ids: Sequence[int], prompt_len: int, live: Any) -> tuple[Any, int | None]:
        """A construction the backend builds by its own means (``Backend.construct``: llama.cpp's ``warm`` from
        its prompt cache, ``restore`` from the ``live`` state saved and loaded); the forwards it ran are
        counted here and the state fault hook sees the result. Returns the state and the tokens reused."""
        state, calls, tokens, reused = self.backend.construct(name, ids, prompt_len, live)
        self.cost.forward_calls += calls
        self.cost.forward_tokens += tokens
        if self.faults.state is not None:
            self.faults.state(state, self.path)
        return state, reused

    def build_state(self, ids: Sequence[int], chunks: Sequence[int]) -> Any:
        """A fresh cache filled by feeding ``ids`` in ``chunks``."""
        if sum(chunks) != len(ids):
            raise KvauditError(f"chunk schedule {list(chunks)} sums to {sum(chunks)}, not {len(ids)}")
        c = self.fresh()
        pos = 0
        for n in chunks:
            self.step(ids[pos : pos + n], c)
            pos += n
        if self.faults.state is not None:
            self.faults.state(c, self.path)
        return c


def _argmax(logits: Any) -> int:
    return int(logits.argmax().item())


def _pick(logits: Any) -> tuple[int, float]:
    """The greedy token (argmax: the lowest index among ties) and its top-2 margin, in one device sync."""
    import torch

    top2 = logits.float().topk(2).values if logits.numel() > 1 else logits.float().repeat(2)
    tok, margin = torch.stack([logits.argmax().to(torch.float32), (top2[0] - top2[1]).to(torch.float32)]).tolist()
    return int(tok), float(margin)


class _LogitsDigest:
    def __init__(self) -> None:
        self.h = kv.digest(b"logits")

    def add(self, logits: Any) -> None:
        self.h.update(kv.tensor_bytes(logits))

    def hexdigest(self) -> str:
        return self.h.hexdigest()


def continue_greedy(dec: Decoder, state: Any, last_token: int, budget: int, margins: list[float] | None = None,
                    follow: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], str]:
    """Feed ``last_token`` onto ``state`` (mutated), then decode greedily up to ``budget`` tokens or EOS.

    Returns the suffix and the digest of every logits vector on the way; ``margins`` (when given)
    receives each step's top-2 margin. With ``follow``, decoding also stops at the first token that departs
    from it: whether the suffix equals ``follow`` is decided there (the layer sweep asks only that). The
    decoder's stop rule (``dec.stop``) ends the suffix where its text says, as it ends the live one.
    """
    digest = _LogitsDigest()
    suffix: list[int] = []
    tok = last_token
    while len(suffix) < budget:
        logits = dec.step([tok], state)
        digest.add(logits)
        if margins is None:
            tok = _argmax(logits)
        else:
            tok, m = _pick(logits)
            margins.append(m)
        suffix.append(tok)
        if tok in dec.eos_ids or (follow is not None and follow[len(suffix) - 1:len(suffix)] != (tok,)):
            break
        if dec.stop is not None and dec.stop(suffix):
            break
    return tuple(suffix), digest.hexdigest()


@dataclass
class Trajectory:
    """Greedy generation from the prompt with a retained cache (prompt in one forward, then one token each)."""

    prompt_ids: tuple[int, ...]
    generated: tuple[int, ...]
    boundary: int | None  # generated tokens inside the prefix
    reason: str | None  # why the item is ineligible, None when it is eligible
    state_fp: str | None = None
    logits_fp: str | None = None
    state: Any = field(default=None, repr=False)  # the live boundary cache, when kept
    margins: tuple[float, ...] = ()  # top-2 margin at each suffix step

    @property
    def prefix(self) -> tuple[int, ...]:
        assert self.boundary is not None
        return self.prompt_ids + self.generated[: self.boundary]

    @property
    def suffix(self) -> tuple[int, ...]:
        assert self.boundary is not None
        return self.generated[self.boundary :]


def trajectory(
    dec: Decoder,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    rule: BoundaryRule,
    decode: Callable[[Sequence[int]], str],
    keep_state: bool = False,
) -> Trajectory:
    """Generate greedily, snapshotting the cache over ``prefix[:-1]`` when the boundary is reached."""
    cache = dec.fresh()
    logits = dec.step(list(prompt_ids), cache)
    gen: list[int] = []
    boundary: int | None = None
    state_fp = None
    state = None
    digest = _LogitsDigest()
    margins: list[float] = []
    while len(gen) < max_new_tokens:
        if boundary is None:
            tok = _argmax(logits)
        else:
            tok, m = _pick(logits)
            margins.append(m)
        gen.append(tok)
        if boundary is None and find_boundary(gen, rule, decode) is not None:
            boundary = len(gen)
            state_fp = kv.fingerprint(cache)
            if keep_state:
                state = kv.clone(cache)
        if tok in dec.eos_ids or len(gen) >= max_new_tokens:
            break
        if boundary is not None and len(gen) > boundary and dec.stop is not None and dec.stop(gen[boundary:]):
            break  # the suffix is whole: every construction's continuation stops by the same rule
        logits = dec.step([tok], cache)
        if boundary is not None:
            digest.add(logits)
    reason = None
    if boundary is None:
        reason = "boundary_not_reached"
    elif gen[boundary - 1] in dec.eos_ids:
        reason = "boundary_at_eos"
    elif boundary >= max_new_tokens:
        reason = "no_suffix_budget"
    return Trajectory(
        prompt_ids=tuple(prompt_ids),
        generated=tuple(gen),
        boundary=boundary,
        reason=reason,
        state_fp=state_fp,
        logits_fp=digest.hexdigest() if boundary is not None else None,
        state=state,
        margins=tuple(margins),
    )
