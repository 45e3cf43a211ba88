"""vLLM's fp8 KV cache (``--kvaudit-cache=quantized:fp8`` under ``--kvaudit-backend=vllm``), judged by
``lossy_cache_budget`` as transformers' quantized caches are (:func:`pytest_kvaudit.core.compute.probes.lossy_axis`).

An fp8 cache is vLLM's ``kv_cache_dtype=fp8``: a setting of the engine, not of a request, so the probe opens a second
engine on the same checkpoint, precision and ``--kvaudit-engine-arg`` settings with that one argument added (once per
worker, when the first precision's probes run; kept while the precision is the same). For each eligible unit it serves
the request the exact engine's ``prefill`` construction served
(:func:`pytest_kvaudit.core.requests.arithmetic.request_shape`: ``prefix[:-1]`` at once on an empty prefix cache,
``prefix[-1]`` forced as a decode step, the suffix budget, the item set's stop rule), so the cache's dtype is the only
difference, and records the outcome in ``rec.probes.cache["quantized:fp8"]`` in the form every lossy probe records
(:func:`pytest_kvaudit.core.compute.probes.lossy_outcome`). The lossy engine's settings go to the run's environment
(``vllm_lossy_*``).

vLLM's CPU attention holds an fp8 cache only on x86 with AVX-512 or AMX (``cpu_attn.py``): elsewhere the run stops
before its first cell with one line naming the CPU (:func:`check`)."""

from __future__ import annotations

import gc
import platform
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.compute.probes import ProbeStore, audited, lossy_outcome
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.items import stopper, token_text
from pytest_kvaudit.core.requests.arithmetic import margins, request_shape, stopped

__all__ = ["ARGS", "KIND", "SAID", "cache_probe", "check", "close", "lossy_engine"]

KIND = "quantized:fp8"
#: what the lossy engine adds to the run's engine arguments
ARGS = {"kv_cache_dtype": "fp8"}
SAID = "vLLM's kv_cache_dtype=fp8"
#: the lossy engine this worker holds: (checkpoint, precision, arguments) -> backend; one at a time
_OPEN: dict[tuple[str, str, tuple[tuple[str, str], ...]], Any] = {}


def cpu_name() -> str:
    """The CPU's model name as the kernel reports it (``platform.processor()`` where it does not)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def check(cfg: AuditConfig) -> None:
    """One line, before any cell, where this run's fp8 cache cannot be: the user's own ``kv_cache_dtype`` (the
    exact engine would be lossy too), or a CPU without AVX-512 or AMX (vLLM's CPU attention needs one)."""
    given = dict(cfg.engine_args).get("kv_cache_dtype")
    if given not in (None, "auto"):
        raise KvauditError(f"--kvaudit-cache={KIND} compares {SAID} with the exact cache, but --kvaudit-engine-arg "
                           f"kv_cache_dtype={given} makes the exact engine's cache lossy too: leave one of them out")
    import torch
    from vllm.platforms import current_platform

    if current_platform.is_cpu() and not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported()):
        raise KvauditError(f"--kvaudit-cache={KIND} on vllm: this CPU ({cpu_name()}) has neither AVX-512 nor AMX, "
                           "which vLLM's CPU attention needs for an fp8 KV cache; run it on an x86 CPU with AVX-512 or "
                           f"AMX or on a GPU, or leave {KIND} out of --kvaudit-cache")


def lossy_engine(cfg: AuditConfig, dtype: str) -> Any:
    """The fp8-cache engine for ``dtype``: opened the first time, kept while the precision is the same."""
    from pytest_kvaudit.engines.vllm.backend import open_backend

    args = dict(cfg.engine_args) | ARGS
    key = (cfg.model, dtype, tuple(sorted(args.items())))
    if key not in _OPEN:
        close()  # one lossy engine at a time, as one exact model
        check(cfg)
        try:
            _OPEN[key] = open_backend(cfg.model, dtype, cfg.device, None, cfg.trust_remote_code, cfg.allow_pickle,
                                      cfg.device_map, engine_args=args)
        except KvauditError as exc:  # the engine's own refusal (a GPU without fp8 attention), in one line
            said = (str(exc.__cause__ or exc).strip().splitlines() or [type(exc).__name__])[-1][:300]
            from vllm.platforms import current_platform

            room = "" if current_platform.is_cpu() or "gpu_memory_utilization" in args else (
                " (on a GPU both engines share its memory: e.g. --kvaudit-engine-arg gpu_memory_utilization=0.4)")
            raise KvauditError(f"--kvaudit-cache={KIND}: vLLM opens no engine with kv_cache_dtype=fp8 for {cfg.model} "
                               f"at {dtype}: {said}{room}") from None
    return _OPEN[key]


def close() -> None:
    """Let the lossy engine go. vLLM tears down its process-wide parallel state with an engine, so no engine
    open beside it is used after this: the store calls it (through :func:`lossy_engine`) only once the next
    precision's cells are done, and nothing else runs on the exact engine of that precision."""
    _OPEN.clear()
    gc.collect()


def settings(be: Any, dtype: str) -> dict[str, Any]:
    """The lossy engine's facts for the run's environment, per precision where the exact engine's are."""
    env = be.environment
    return {"vllm_lossy_kv_cache_dtype": {dtype: ARGS["kv_cache_dtype"]},
            "vllm_lossy_kv_cache_storage": dict(env["vllm_kv_cache_dtype"]),
            "vllm_lossy_attention_backend": dict(env["vllm_attention_backend"]),
            "vllm_lossy_attention_isa": dict(env["vllm_attention_isa"]), "vllm_lossy_engine_args": be.engine_args}


def cache_probe(store: ProbeStore, h: Any, dtype: str, kind: str) -> None:
    """``kind`` (``quantized:fp8``, the one vLLM runs) on this precision's eligible units: each unit's prefill
    request served again by the fp8-cache engine and set against the exact engine's."""
    if kind != KIND:  # refused at configure (EngineSpec.cache_kinds); a store built by hand says it here
        raise KvauditError(f"--kvaudit-cache={kind}: the vllm backend runs {KIND} ({SAID})")
    units = [(item, rec) for item, rec in audited(store, dtype)
             if rec.boundary is not None and "prefill" in rec.constructions]
    if not units:
        return
    be = lossy_engine(store.cfg, dtype)
    for key, value in settings(be, dtype).items():
        if isinstance(value, Mapping) and key != "vllm_lossy_engine_args":
            store.environment.setdefault(key, {}).update(value)
        else:
            store.environment[key] = value
    iset = store.item_set
    decode = partial(token_text, h.tokenizer)
    stop = stopper(iset, decode)
    rule = {"regex": iset.stop_regex, "after": 1, "lead": []} if iset.stop_regex is not None else None
    for _, rec in units:
        assert rec.boundary is not None
        first, force, _, _, _ = request_shape("prefill", rec.prompt_ids, rec.prefix)
        be.reset()  # cold, as the exact prefill: nothing cached
        d = be.run([(first, len(force) + iset.max_new_tokens - rec.boundary, force, rule)])[0]
        if d.cached or tuple(d.tokens[: len(force)]) != tuple(force):
            raise KvauditError(f"vllm: the {KIND} prefill of {rec.item_id} hit {d.cached} cached tokens or did not "
                               "take its forced id")
        tokens = d.prompt_len - d.cached + max(len(d.tokens) - 1, 0)
        store.cost.forward_calls += len(d.steps)
        store.cost.forward_tokens += tokens
        suffix, rows = stopped(stop, d.tokens[len(force):], d.rows[len(force):])
        rec.probes.cache[kind] = lossy_outcome(rec, suffix, margins(rows), decode, iset.answer_regex, tokens)
