"""The vLLM backend (``--kvaudit-backend=vllm``): a safetensors checkpoint served by vLLM's own engine, in
process, with its automatic prefix cache, paged K/V blocks and scheduler.

vLLM cannot run one forward of caller-chosen ids on a caller-held cache, so its constructions are *requests*
(:mod:`pytest_kvaudit.core.requests.cells` builds the cell from them) and this module is the engine's side of them:

- :meth:`VllmBackend.run` serves a batch of requests greedily (``temperature=0``) and returns, per request,
  its tokens, the top-k raw logits of every step (``logprobs_mode="raw_logits"``), ``num_cached_tokens``
  (the prefix-cache hit), the KV blocks it held (read by a hook on the scheduler's free path) and the tokens
  the scheduler gave it in each engine step (the chunked-prefill proof);
- a request may be *teacher-forced* over given ids (:class:`.force.ForceTokens`, a logits processor that masks
  every other token while the forced ids last): the K/V of those ids are then written by decode steps, as the
  live request wrote its own, which is how the bridge (``incremental``) and the 2x2's replay are built;
- :meth:`VllmBackend.read` copies a request's K/V out of its blocks on every rank, through the layout the
  attention backend declares (:mod:`.layout`, :mod:`.ranks`), and :meth:`VllmBackend.write` writes
  them back to every rank (the transplants; a fault that perturbs a cached block).

The names read here (``engine_core``, ``model_runner.kv_caches``, ``scheduler._free_request_blocks``) are
internal to one vLLM version: :data:`PINNED` is the one this module was written against, and a moved name is
one line that says which (:func:`internal`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.requests.protocol import Done, Request, ServesRequests
from pytest_kvaudit.core.requests.state import PagedState
from pytest_kvaudit.core.runtime.loading import load_tokenizer, model_identity, read_config
from pytest_kvaudit.engines.vllm.engine import (
    DTYPES,
    FORCE,
    NAME,
    PINNED,
    STOP,
    TOP_K,
    SchedulerHooks,
    engine_kwargs,
    eos_ids,
    internal,
    load_vllm,
    refusal,
)
from pytest_kvaudit.engines.vllm.ranks import Ranks

__all__ = ["NAME", "PINNED", "Done", "Request", "VllmBackend", "internal", "open_backend"]


class VllmBackend(ServesRequests):
    """One checkpoint at one precision in one in-process vLLM engine, request level
    (:class:`pytest_kvaudit.core.model.engine_protocol.Backend`)."""

    engine = NAME
    per_layer = True
    #: its constructions are requests: :mod:`pytest_kvaudit.core.requests.cells` builds them
    constructions: tuple[str, ...] = ()

    def __init__(self, path: Path, dtype: str, spec: str, trust_remote_code: bool,
                 engine_args: Mapping[str, str] | None = None) -> None:
        """``engine_args`` (``--kvaudit-engine-arg``, e.g. ``tensor_parallel_size=2``) go to ``vllm.LLM`` over
        kvaudit's defaults (:func:`.engine.engine_kwargs`)."""
        vllm = load_vllm()
        if dtype not in DTYPES:
            raise KvauditError(f"--kvaudit-dtypes={dtype}: the {NAME} backend runs {', '.join(DTYPES)}")
        from vllm.platforms import current_platform

        from pytest_kvaudit.engines.vllm.force import ForceTokens

        #: the user's --kvaudit-engine-arg, as given (recorded and compared by the gate), and what reached vllm.LLM
        self.engine_args = dict(sorted((engine_args or {}).items()))
        kwargs, invariant = engine_kwargs(self.engine_args, current_platform.is_cpu())
        if invariant:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.llm = vllm.LLM(model=str(path), dtype=DTYPES[dtype], enable_prefix_caching=True,
                                    logprobs_mode="raw_logits", seed=0, trust_remote_code=trust_remote_code,
                                    logits_processors=[ForceTokens], **kwargs)
        except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
            if not self.engine_args:
                raise
            raise refusal(self.engine_args, exc) from exc
        self.load_seconds = round(time.perf_counter() - t0, 3)
        self.version = vllm.__version__
        core = internal(self.llm, "llm_engine.engine_core.engine_core")
        self.scheduler = internal(core, "scheduler")
        mc, pc = internal(core, "vllm_config.model_config"), internal(core, "vllm_config.parallel_config")
        # every rank's caches, through the executor (in process at TP=1), in the layout its backend declares
        self.ranks = Ranks(self.llm, int(mc.get_total_num_kv_heads()), int(pc.pipeline_parallel_size))
        rank0 = self.ranks.info[0]
        eager = bool(mc.enforce_eager)
        self.dtype, self.block_size = dtype, self.ranks.layout.block_size
        # the ledger keys its environment on this name: the engine, its version and what decides its bits, with
        # every --kvaudit-engine-arg (so the gate compares them; TP is one of them)
        given = "".join(f" {k}={v}" for k, v in self.engine_args.items())
        self.attn_implementation = (f"vllm {vllm.__version__} {rank0['attention_backend']} block {self.block_size} "
                                    f"{'eager' if eager else 'cuda graphs'}{given}")
        self.device = str(internal(core, "vllm_config.device_config.device_type"))
        self.tokenizer = load_tokenizer(path, trust_remote_code)
        self.vocab_size = int(mc.get_vocab_size())
        self.top_k = min(TOP_K, self.vocab_size)
        self.max_positions: int | None = int(mc.max_model_len)
        self.eos_ids = eos_ids(path, self.tokenizer)
        self.identity = model_identity(spec, path) | {"backend": NAME}
        self.hooks = SchedulerHooks(self.scheduler)
        self.budget = int(self.scheduler.max_num_scheduled_tokens)
        self.environment = environment(self, core, dtype, eager)

    # -- requests ------------------------------------------------------------------------------
    def close(self) -> None:
        """Shut the engine down now. vLLM tears down its process-wide parallel state when an engine's core shuts
        down, which it otherwise does whenever the garbage collector reaches the engine: after the next precision's
        engine has set that state up, which then fails ("pipeline model parallel group is not initialized"; a run
        of three precisions in one process did). The store calls this when it lets a precision go; vLLM's own
        shutdown runs once, so the collector's later call does nothing."""
        client = getattr(getattr(getattr(self, "llm", None), "llm_engine", None), "engine_core", None)
        shutdown = getattr(client, "shutdown", None)
        if callable(shutdown):
            shutdown()

    def reset(self) -> None:
        """Empty the prefix cache: the next request hits nothing."""
        if not self.llm.reset_prefix_cache():
            raise KvauditError(f"{NAME}: reset_prefix_cache() refused (requests still running?)")

    def run(self, requests: Sequence[Request], budget: int | None = None) -> list[Done]:
        """Serve ``(prompt ids, max_tokens, forced ids[, stop rule])`` requests in one call (one batch), greedily;
        ``budget`` sets the scheduler's token budget per step for this call (chunked prefill). A stop rule
        (:data:`.engine.STOP`, without ``eos``: this backend adds it) ends the request where the item set's
        stop regex matches its suffix, as a transformers decoder stops, rather than at ``max_tokens``."""
        from vllm import SamplingParams

        self.hooks.clear()
        params = [SamplingParams(temperature=0.0, max_tokens=r[1], logprobs=self.top_k,
                                 stop_token_ids=sorted(self.eos_ids), detokenize=False,
                                 extra_args=self._extra(r)) for r in requests]
        old = self.scheduler.max_num_scheduled_tokens
        self.scheduler.max_num_scheduled_tokens = budget or old
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs = self.llm.generate([{"prompt_token_ids": list(r[0])} for r in requests], params, use_tqdm=False)
        finally:
            self.scheduler.max_num_scheduled_tokens = old
        done = []
        for (prompt, *_), out in zip(requests, outs):
            rid = next(k for k in self.hooks.freed if k.split("-")[0] == out.request_id)
            c = out.outputs[0]
            rows = [sorted(((int(t), float(lp.logprob)) for t, lp in row.items()),
                           key=lambda x: (-x[1], x[0]))[: self.top_k]
                    for row in (c.logprobs or [])]
            steps = [(s[rid], len(s)) for s in self.hooks.steps if rid in s]
            done.append(Done(len(prompt), tuple(int(t) for t in c.token_ids), rows, int(out.num_cached_tokens or 0),
                             self.hooks.freed[rid], steps))
        return done

    def _extra(self, request: Request) -> dict[str, Any] | None:
        extra: dict[str, Any] = {}
        if request[2]:
            extra[FORCE] = list(request[2])
        stop = request[3] if len(request) > 3 else None
        if stop is not None and self.eos_ids:  # without an EOS id there is nothing to stop on: to the budget
            extra[STOP] = dict(stop) | {"eos": min(self.eos_ids)}
        return extra or None

    # -- blocks --------------------------------------------------------------------------------
    def read(self, blocks: Sequence[int], positions: int) -> Any:
        """The K/V of the first ``positions`` positions held in ``blocks``, every layer, from every rank."""
        return PagedState(self.ranks.read(self.blocks_for(positions, blocks), positions), positions, self.block_size,
                          self.ranks.tp)

    def write(self, blocks: Sequence[int], state: Any) -> None:
        """Overwrite the cells of ``state``'s positions in ``blocks``, every layer, on every rank (a partial last
        block is written up to the state's last position)."""
        self.ranks.write(self.blocks_for(state.positions, blocks), state.layers)

    # -- the protocol's remaining words (``step``, ``encode``, ``decode``: :class:`ServesRequests`) ------------
    def shape(self) -> dict[str, int]:
        lay = self.ranks.layout
        return {"layers": int(self.ranks.info[0]["layers"]), "kv_heads": lay.kv_heads * self.ranks.tp,
                "head_dim": lay.head_size, "parameters": 0, "recurrent": 0}


def environment(backend: VllmBackend, core: Any, dtype: str, eager: bool) -> dict[str, Any]:
    """What decides this engine's bits, for the ledger's environment (the gate compares it): the version, the
    attention backend and its declared layout (memory order, K/V split, kernel blocks), the ranks, and every
    ``--kvaudit-engine-arg``."""
    rank0, pc, lay = backend.ranks.info[0], internal(core, "vllm_config.parallel_config"), backend.ranks.layout
    return {
        "vllm": backend.version, "vllm_pinned": PINNED, "vllm_attention_backend": {dtype: rank0["attention_backend"]},
        "vllm_block_size": backend.block_size, "vllm_enforce_eager": eager, "vllm_cuda_graphs": not eager,
        "vllm_engine_args": backend.engine_args,
        "vllm_batch_invariant": os.environ.get("VLLM_BATCH_INVARIANT") == "1",
        "vllm_max_num_batched_tokens": backend.budget,
        "vllm_chunked_prefill": bool(internal(core, "vllm_config.scheduler_config.enable_chunked_prefill")),
        "vllm_kv_cache_dtype": {dtype: rank0["dtype"]}, "vllm_kv_layout": {dtype: rank0["shape"]},
        "vllm_attention_isa": {dtype: rank0["isa"]}, "vllm_logprobs_mode": "raw_logits",
        "vllm_state_source": "kv_blocks",
        "not_available": ["layer sweep (transplants are all layers or the identical ones)",
                          "batch invariance probe (see the batched(B) construction)", "attention axes",
                          "cache kinds but quantized:fp8 (kv_cache_dtype=fp8)",
                          "pipeline parallel (each rank a slice of the layers)"],
        "vllm_kv_cache_layout": {dtype: lay.as_dict()}, "vllm_tensor_parallel_size": backend.ranks.tp,
        "vllm_pipeline_parallel_size": int(pc.pipeline_parallel_size), "vllm_kv_heads_per_rank": lay.kv_heads,
    }


def open_backend(spec: str, dtype: str, device: str = "auto", attn: str | None = None, trust_remote_code: bool = False,
                 allow_pickle: bool = False, device_map: str | None = None,
                 engine_args: Mapping[str, str] | None = None) -> VllmBackend:
    load_vllm()  # the engine missing is the first thing to say
    path = Path(spec).expanduser()
    if path.is_file() or path.suffix == ".gguf":
        raise KvauditError(f"--kvaudit-backend={NAME} serves safetensors checkpoint folders: {spec!r} is a file "
                           "(a GGUF runs with --kvaudit-backend=llama.cpp)")
    if not path.is_dir():
        raise KvauditError(f"--kvaudit-backend={NAME}: {spec!r} is not a checkpoint folder (hub ids are not fetched)")
    if attn not in (None, "auto", "sdpa", "eager"):
        raise KvauditError(f"--kvaudit-attn={attn}: the {NAME} backend picks its own attention backend (recorded)")
    from vllm.model_executor.models import ModelRegistry

    archs = read_config(path).get("architectures") or []
    supported = set(ModelRegistry.get_supported_archs())
    if not archs or not any(a in supported for a in archs):
        import vllm

        named = ", ".join(archs) or "no architectures in config.json"
        raise KvauditError(f"vLLM {vllm.__version__} cannot serve {spec} ({named}): not in its model registry; audit "
                           "it with --kvaudit-backend=transformers")
    return VllmBackend(path, dtype, spec, trust_remote_code, engine_args)
