"""The transformers-cb backend (``--kvaudit-backend=transformers-cb``): a checkpoint served by transformers' own
continuous batching (``ContinuousBatchingManager``, the engine behind ``generate_batch`` and ``transformers serve
--continuous-batching``) on a ``PagedAttentionCache`` with prefix block sharing, in process.

It is a request-level engine, as vLLM is: the audit hands it whole requests and reads their K/V out of the pages
the cache allocator gave them (:mod:`.loop`). :meth:`CbBackend.run` serves a call's requests greedily and returns
each as a :class:`Done`: its tokens, the top-k raw logits of every step, the prefix match the cache found for it
(the proof of a hit), its blocks and the tokens each engine step gave it. :meth:`CbBackend.read` copies K/V out of
pages and :meth:`CbBackend.write` writes them back, both while the loop is paused (or from the loop's own thread
between two steps: a transplant).

The manager's loop runs in a thread that is not a daemon: an interpreter that exits with it running waits forever.
:meth:`CbBackend.close` stops it, and it is registered to run before the interpreter joins its threads, so every
path out (an error included) stops the loop.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.requests.protocol import Done, ServesRequests
from pytest_kvaudit.core.requests.state import PagedState
from pytest_kvaudit.core.requests.stop import StopRow
from pytest_kvaudit.core.runtime.loading import open_model
from pytest_kvaudit.engines.transformers_cb.loop import Hooks, Job
from pytest_kvaudit.engines.transformers_cb.settings import NAME, WRITTEN_FOR, CbSettings, check_version, parse

TOP_K = 20
#: seconds a call waits for a result before it says the loop is stuck
WAIT = 600.0
_ATTN = {None: "sdpa", "auto": "sdpa", "sdpa": "sdpa", "eager": "paged|eager"}


class CbBackend(ServesRequests):
    """One checkpoint at one precision in one continuous-batching manager, request level."""

    engine = NAME
    per_layer = True
    constructions: tuple[str, ...] = ()

    def __init__(self, spec: OpenSpec) -> None:
        self.version = check_version()
        self.settings: CbSettings = parse(dict(spec.engine_args))
        self.engine_args = dict(sorted(spec.engine_args.items()))
        if spec.attn not in _ATTN:
            raise KvauditError(f"--kvaudit-attn={spec.attn}: {NAME} runs sdpa or eager (transformers' paged|eager)")
        t0 = time.perf_counter()
        h = open_model(replace(spec, attn="sdpa" if _ATTN[spec.attn] == "sdpa" else "eager"))
        self.model, self.tokenizer, self.dtype, self.device = h.model, h.tokenizer, h.dtype, h.device
        self.identity = h.identity | {"backend": NAME}
        self.eos_ids, self.vocab_size, self.max_positions = h.eos_ids, h.vocab_size, h.max_positions
        self.top_k = min(TOP_K, self.vocab_size)
        self.manager: Any = None
        self._held: dict[tuple[int, ...], Job] = {}
        self._count = 0
        self._start(_ATTN[spec.attn])
        self.load_seconds = round(time.perf_counter() - t0, 3)
        s = self.settings
        impl = getattr(self.model.config, "_attn_implementation", _ATTN[spec.attn])
        self.attn_implementation = (f"transformers-cb {self.version} {impl} page {s.page_size} blocks {s.num_blocks} "
                                    f"batch {s.max_batch_tokens} sharing {'on' if s.allow_block_sharing else 'off'} "
                                    f"margin {s.safety_margin}")
        self.environment = environment(self, str(impl))

    # -- the manager -----------------------------------------------------------------------------
    def _start(self, attn: str) -> None:
        self.manager, self.hooks = start_manager(self.model, self.settings, attn, self.eos_ids, self.decode, self.top_k)
        self.cache = self.hooks.cache
        self.block_size = self.hooks.page
        self.batch_processor = self.manager.batch_processor
        self.budget = int(self.batch_processor.max_batch_tokens)
        threading._register_atexit(self.close)  # type: ignore[attr-defined]  # before threads are joined
        self.manager.start()

    def close(self) -> None:
        """Stop the manager's loop (it is not a daemon thread); safe to call twice."""
        m, self.manager = self.manager, None
        if m is not None and m.is_running():
            m.stop(block=True, timeout=30)

    def _paused(self) -> Any:
        if self.manager is None or not self.manager.is_running():
            raise KvauditError(f"{NAME}: the continuous-batching loop is not running (stopped, or it died: see above)")
        return self.manager.pause()

    # -- requests ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every cached block: the next request matches no prefix."""
        with self._paused():
            if self.hooks.allocator.block_table:
                raise KvauditError(f"{NAME}: the cache still holds requests {sorted(self.hooks.allocator.block_table)}")
            self.cache.evict_cached_blocks()
        self._held = {}

    def run(self, requests: Sequence[Any], budget: int | None = None) -> list[Done]:
        """Serve ``(prompt ids, max_tokens, forced ids[, stop rule])`` requests in one call, greedily, all handed to
        the loop at once (one pause); ``budget`` sets the scheduler's token budget per step for this call."""
        h, m = self.hooks, self.manager
        h.jobs, h.error, self._held = {}, None, {}
        rids = []
        with self._paused():
            self.batch_processor.max_batch_tokens = budget or self.budget
            for r in requests:
                self._count += 1
                rid = f"kvaudit-{self._count}"
                stop = r[3] if len(r) > 3 else None
                h.jobs[rid] = Job(StopRow(r[2], stop, []), min(self.eos_ids) if self.eos_ids else None)
                rids.append(rid)
                m.add_request(list(r[0]), request_id=rid, max_new_tokens=int(r[1]),
                              eos_token_id=sorted(self.eos_ids) or -1)
            h.first = rids[0]
        try:
            results = collect(m, set(rids))
        finally:
            self.batch_processor.max_batch_tokens = self.budget
            h.between = None
        if h.error is not None:
            raise h.error
        done = []
        for (prompt, *_), rid in zip(requests, rids):
            job, out = h.jobs[rid], results[rid]
            tokens = tuple(int(t) for t in out.generated_tokens)
            if len(job.rows) != len(tokens):
                raise KvauditError(f"{NAME}: request {rid} gave {len(tokens)} tokens but {len(job.rows)} logit rows "
                                   "(the logits processor did not see every step)")
            done.append(Done(len(prompt), tokens, job.rows, job.matched, job.blocks, job.steps))
            self._held[tuple(job.blocks)] = job
        return done

    # -- pages ---------------------------------------------------------------------------------
    def read(self, blocks: Sequence[int], positions: int) -> PagedState:
        """The K/V of the first ``positions`` positions held in ``blocks``, every layer: as they were when the
        request of the last call that held them finished, else as the pages hold them now."""
        pages = self.blocks_for(positions, blocks, "pages")
        job = self._held.get(tuple(blocks))
        if job is not None and job.pages is not None:
            layers = job.pages
        else:
            with self._paused():
                layers = self.hooks.read_pages(pages)
        return PagedState([t[:, :, :positions].clone() for t in layers], positions, self.block_size)

    def write(self, blocks: Sequence[int], state: Any) -> None:
        """Overwrite the cells of ``state``'s positions in ``blocks``, every layer (a partial last page up to the
        state's last position); from the loop's own thread (between two steps) or while it is paused."""
        pages = self.blocks_for(state.positions, blocks, "pages")
        if threading.current_thread() is getattr(self.manager, "_generation_thread", None):
            self.hooks.write_pages(pages, state.layers, state.positions)
        else:
            with self._paused():
                self.hooks.write_pages(pages, state.layers, state.positions)
        self._held = {}

    # -- the protocol's remaining words (``step``, ``encode``, ``decode``: :class:`ServesRequests`) ------------
    def shape(self) -> dict[str, int]:
        c = self.model.config.get_text_config()
        heads = int(c.num_attention_heads)
        return {"layers": len(self.hooks.layers), "kv_heads": int(getattr(c, "num_key_value_heads", None) or heads),
                "head_dim": int(getattr(c, "head_dim", None) or c.hidden_size // heads),
                "parameters": int(sum(p.numel() for p in self.model.parameters())), "recurrent": 0}

def collect(manager: Any, rids: set[str]) -> dict[str, Any]:
    """The finished results of ``rids``, or one line saying why they did not come."""
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    while rids - set(out):
        r = manager.get_result(timeout=1)
        if r is not None and r.request_id in rids and r.is_finished():
            if r.error is not None:
                raise KvauditError(f"{NAME}: request {r.request_id} failed in the loop: {r.error}")
            out[r.request_id] = r
        elif r is None and not manager.is_running():
            raise KvauditError(f"{NAME}: the continuous-batching loop stopped with requests unfinished")
        elif time.perf_counter() - t0 > WAIT:
            raise KvauditError(f"{NAME}: no result in {WAIT:.0f} s (the loop is stuck)")
    return out


def start_manager(model: Any, s: CbSettings, attn: str, eos_ids: frozenset[int], decode: Any,
                  top_k: int) -> tuple[Any, Hooks]:
    """A continuous-batching manager over ``model`` with the engine's settings, its batch processor built and
    hooked (:class:`.loop.Hooks`), not yet started; a configuration transformers refuses is one line."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    gen = GenerationConfig(do_sample=False, eos_token_id=sorted(eos_ids) or -1, pad_token_id=0)
    cbc = ContinuousBatchingConfig(page_size=s.page_size, num_blocks=s.num_blocks,
                                   max_batch_tokens=s.max_batch_tokens, allow_block_sharing=s.allow_block_sharing,
                                   safety_margin=s.safety_margin, use_async_batching=False, use_cuda_graph=False,
                                   auto_switch_to_flash=False, scheduler_type="fifo")
    if attn != "sdpa":
        model.set_attn_implementation(attn)
    try:
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cbc)
        manager.warmup()  # builds the batch processor (cache, scheduler) the hooks attach to
    except (ValueError, TypeError, MemoryError, RuntimeError) as exc:
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
        raise KvauditError(f"transformers' continuous batching refused {s.as_dict()}: {said}") from exc
    return manager, Hooks(manager, decode, top_k)


def environment(be: CbBackend, impl: str) -> dict[str, Any]:
    """What decides this engine's bits, for the ledger's environment (the gate compares it)."""
    return {"transformers_cb": be.version, "transformers_cb_written_for": WRITTEN_FOR,
            "transformers_cb_settings": be.settings.as_dict(), "transformers_cb_engine_args": be.engine_args,
            "transformers_cb_attention": {be.dtype: impl}, "transformers_cb_state_source": "paged_cache",
            "not_available": ["layer sweep (transplants are all layers or the identical ones)",
                              "batch invariance probe (see the batched(B) construction)", "attention axes",
                              "cache kinds beyond dynamic"]}


def open_spec(spec: OpenSpec) -> Any:
    """The engine's opener (:attr:`pytest_kvaudit.core.engine.record.EngineSpec.opener`): request level, it serves
    requests (:class:`pytest_kvaudit.core.requests.protocol.RequestBackend`), not the forward-level ``Backend``."""
    return CbBackend(spec)


def open_backend(model: str, dtype: str, engine_args: Mapping[str, str] | None = None) -> Any:
    """:func:`open_spec` for scripts and tests that name only the model, precision and settings."""
    from types import MappingProxyType

    return open_spec(OpenSpec(model, dtype, "cpu", None, engine_args=MappingProxyType(dict(engine_args or {}))))
