"""The llama.cpp backend (``--kvaudit-backend=llama.cpp``): a GGUF file run natively by llama-cpp-python, with
its quantized weights and llama.cpp's own CPU kernels, one thread.

How the audit's words map onto the engine:

- a *state* is a llama.cpp context (:class:`LlamaCppState`) holding one sequence; contexts share the loaded
  weights, so a fresh one costs an allocation, not a load. Its fingerprint is the digest of the sequence's
  state bytes (``llama_state_seq_get_data``: the KV cells, their positions and every layer's K and V; no
  logits, no sampler or RNG, which that call never writes);
- ``live``, ``prefill``, ``incremental``, ``chunked(c)``: the chunk schedules, each chunk one ``llama_decode``
  on a fresh context (``n_batch = n_ubatch = 512`` never splits a chunk of the audited lengths further;
  longer ones are split by llama.cpp as a server would);
- ``warm``: llama-cpp-python's own prefix reuse (``Llama.generate`` keeps the KV of the longest common prefix
  with the previous request); ``restore``: the live state through ``llama_state_get_data`` /
  ``llama_state_set_data``, the calls ``Llama.save_state`` / ``load_state`` make;
- precision: the K/V cache type (``type_k``/``type_v``); the weights stay as quantized in the file;
- greedy decoding: argmax of the last position's logits read from the context (``logits_all`` off).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError, UnsupportedCacheError
from pytest_kvaudit.core.model.engine_constructions import RESTORE, WARM
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.model.items import token_text
from pytest_kvaudit.core.runtime.gguf import _causal_lm_class, gguf_file
from pytest_kvaudit.core.runtime.loading import file_digest
from pytest_kvaudit.core.runtime.state.whole import NOT_AVAILABLE, WholeState
from pytest_kvaudit.engines.llama_cpp.tokens import LlamaCppTokenizer

NAME = "llama.cpp"
INSTALL = "pip install 'pytest-kvaudit[llamacpp]'"
#: --kvaudit-dtypes value (a name of the one precision table) -> (ggml type id of the K/V cache, its name): the
#: precisions this engine runs (llama-cpp-python's ``llama.py`` exports no BF16 id: 30 is ggml's)
KV_TYPES = {"bf16": (30, "bf16"), "fp16": (1, "f16"), "fp32": (0, "f32"), "q8_0": (8, "q8_0")}
#: a quantized V cache is only implemented inside flash attention in llama.cpp: it is switched on for it
NEEDS_FLASH_ATTN = frozenset({"q8_0"})
N_CTX = int(os.environ.get("KVAUDIT_LLAMACPP_N_CTX", "1024"))
N_BATCH = 512
#: ``1``: let llama.cpp load the weights into its extra buffer types (AMX, repacked layouts). Off by default: a
#: GCC 12 build's AMX int8 kernel segfaults on an AMX Xeon at its first batch of 2+ tokens (upstream
#: ggml-org/llama.cpp#20824; README, "llama.cpp"), and plain CPU buffers keep the kernel paths (and so the bits)
#: the same on CPUs with and without AMX. Read at each load and recorded as ``environment.use_extra_bufts``
EXTRA_BUFTS_ENV = "KVAUDIT_LLAMACPP_EXTRA_BUFTS"


def _llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise KvauditError(f"--kvaudit-backend={NAME} needs llama-cpp-python: {INSTALL}") from exc
    return llama_cpp


class LlamaCppState(WholeState):
    """One sequence in one llama.cpp context, and how many positions it holds."""

    backend = NAME

    def __init__(self, owner: LlamaCppBackend, ctx: Any, n_past: int = 0, lease: int | None = None) -> None:
        #: ``ctx`` is a raw ``llama_context*``: owned and freed with this state, except the warm one's, which is
        #: the engine's own context lent to it until a later request takes it back (the lease moves on)
        self.owner, self.ctx, self.n_past, self.lease = owner, ctx, n_past, lease

    def __del__(self) -> None:
        # freed here, not left to llama-cpp-python's model, which would keep every context to the end of the run
        if self.lease is None and self.ctx is not None:
            self.owner.lc.llama_free(self.ctx)
            self.ctx = None

    def check(self) -> None:
        if self.lease is not None and self.lease != self.owner.lease:
            raise UnsupportedCacheError(f"{NAME}: this warm state's context was taken by a later request")

    def state_bytes(self) -> bytes:
        self.check()
        lc = self.owner.lc
        size = lc.llama_state_seq_get_size(self.ctx, 0)
        buf = (ctypes.c_uint8 * size)()
        n = lc.llama_state_seq_get_data(self.ctx, buf, size, 0)
        return bytes(buf)[:n]

    def _full(self) -> bytes:
        """The whole context's state, what ``Llama.save_state`` keeps (memory, and outputs when any)."""
        self.check()
        lc = self.owner.lc
        size = lc.llama_state_get_size(self.ctx)
        buf = (ctypes.c_uint8 * size)()
        n = lc.llama_state_get_data(self.ctx, buf, size)
        return bytes(buf)[:n]

    def load(self, donor: WholeState) -> None:
        assert isinstance(donor, LlamaCppState)
        blob = donor._full()
        buf = (ctypes.c_uint8 * len(blob)).from_buffer_copy(blob)
        if self.owner.lc.llama_state_set_data(self.ctx, buf, len(blob)) != len(blob):
            raise UnsupportedCacheError(f"{NAME}: llama_state_set_data did not take the donor's {len(blob)} bytes")
        self.n_past = donor.n_past

    def clone(self) -> LlamaCppState:
        out = self.owner.fresh()
        out.load(self)
        return out

    def __deepcopy__(self, memo: dict[int, Any]) -> LlamaCppState:
        return self.clone()


class LlamaCppBackend:
    """A GGUF model loaded once by llama-cpp-python, its K/V cache at one type
    (:class:`pytest_kvaudit.core.model.engine_protocol.Backend`)."""

    per_layer = False
    constructions = (WARM, RESTORE)

    def __init__(self, file: Path, dtype: str, spec: str) -> None:
        lc = self.lc = _llama_cpp()
        if dtype not in KV_TYPES:
            raise KvauditError(f"--kvaudit-dtypes={dtype}: the {NAME} backend runs K/V caches of "
                               f"{', '.join(KV_TYPES)}")
        from llama_cpp import _internals

        self._internals = _internals
        type_id, self.kv_type = KV_TYPES[dtype]
        self.flash_attn = dtype in NEEDS_FLASH_ATTN
        t0 = time.perf_counter()
        extra_bufts = os.environ.get(EXTRA_BUFTS_ENV, "0") == "1"
        # the engine's own object: weights, vocabulary, and the context that serves the warm requests
        with _extra_bufts(extra_bufts):
            self.llm = lc.Llama(str(file), n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_threads=1,
                                n_threads_batch=1, seed=0, logits_all=False, type_k=type_id, type_v=type_id,
                                flash_attn=self.flash_attn, n_gpu_layers=0, verbose=False)
        self.load_seconds = round(time.perf_counter() - t0, 3)
        self.dtype, self.device, self.lease = dtype, "cpu", 0
        self.attn_implementation = f"llama.cpp (flash_attn {'on' if self.flash_attn else 'off'})"
        self.tokenizer = LlamaCppTokenizer(self.llm, spec)
        self.vocab_size = int(self.llm.n_vocab())
        self.eos_ids = frozenset({int(self.llm.token_eos())} | ({int(self.llm._model.token_eot())}
                                                                if self.llm._model.token_eot() >= 0 else set()))
        self.max_positions: int | None = N_CTX
        self._batch = _internals.LlamaBatch(n_tokens=N_CTX, embd=0, n_seq_max=1, verbose=False)
        self.identity = _identity(spec, file, self.llm, lc)
        self.environment = {"llama_cpp_python": lc.__version__, "llama_cpp_system_info":
                            lc.llama_print_system_info().decode().strip(), "kv_cache_type": {dtype: self.kv_type},
                            "flash_attn": {dtype: self.flash_attn}, "n_threads": 1, "n_batch": N_BATCH,
                            "n_ubatch": N_BATCH, "n_ctx": N_CTX, "use_extra_bufts": extra_bufts,
                            "not_available": list(NOT_AVAILABLE)}

    # -- the protocol --------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return token_text(self.tokenizer, ids)

    def fresh(self, kind: str = "dynamic", max_len: int | None = None) -> LlamaCppState:
        if kind != "dynamic":
            raise UnsupportedCacheError(f"the {NAME} backend has one cache layout, its own: not {kind!r}")
        ctx = self.lc.llama_init_from_model(self.llm._model.model, self.llm.context_params)
        if ctx is None:
            raise UnsupportedCacheError(f"{NAME}: llama_init_from_model gave no context (out of memory?)")
        return LlamaCppState(self, ctx)

    def step(self, ids: Sequence[int], state: Any) -> Any:
        """One ``llama_decode`` of ``ids`` at the state's next positions; the last position's logits."""
        import numpy as np
        import torch

        state.check()
        if state.n_past + len(ids) > N_CTX:
            raise UnsupportedCacheError(f"{NAME}: {state.n_past + len(ids)} positions exceed n_ctx={N_CTX}")
        self._batch.set_batch(list(ids), state.n_past, False)
        if self.lc.llama_decode(state.ctx, self._batch.batch) != 0:
            raise UnsupportedCacheError(f"{NAME}: llama_decode failed at position {state.n_past}")
        state.n_past += len(ids)
        row = np.ctypeslib.as_array(self.lc.llama_get_logits_ith(state.ctx, -1), shape=(self.vocab_size,))
        return torch.from_numpy(row.copy())

    def step_batch(self, rows: Sequence[Sequence[int]], pad: int) -> Any:
        raise UnsupportedCacheError(f"the {NAME} backend runs one sequence per context: batch invariance is not "
                                    "available")

    def shape(self) -> dict[str, int]:
        m = self.llm._model
        meta, arch = self.llm.metadata, self.llm.metadata.get("general.architecture", "")
        heads = int(meta.get(f"{arch}.attention.head_count", 1) or 1)
        kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads) or heads)
        return {"layers": int(m.n_layer()) if hasattr(m, "n_layer") else int(meta.get(f"{arch}.block_count", 0)),
                "kv_heads": kv_heads, "head_dim": int(m.n_embd()) // heads, "parameters": int(m.n_params()),
                "recurrent": 0}

    # -- the engine's own constructions ----------------------------------------------------------
    def construct(self, name: str, ids: Sequence[int], prompt_len: int, live: Any) -> tuple[Any, int, int, int | None]:
        """(state, forward calls, forward tokens, tokens reused) of ``warm`` or ``restore``."""
        if name == RESTORE:
            if live is None:
                raise UnsupportedCacheError(f"{NAME}: restore needs the live boundary state")
            return live.clone(), 0, 0, None
        if name != WARM:
            raise KvauditError(f"{NAME} builds no construction {name!r} itself")
        self.lease += 1  # any warm state handed out before is stale from here on
        # a cold engine cache, so that a unit's bits never depend on the item a worker served before it
        self.llm.reset()
        first = list(ids[:min(prompt_len, len(ids) - 1)])  # the first request: the prompt
        calls1, tokens1 = self._request(first) if first else (0, 0)
        calls2, tokens2 = self._request(list(ids))  # the second, prefix[:-1]: what it did not evaluate, it reused
        state = LlamaCppState(self, self.llm._ctx.ctx, len(ids), self.lease)
        return state, calls1 + calls2, tokens1 + tokens2, len(ids) - tokens2

    def _request(self, ids: list[int]) -> tuple[int, int]:
        """One request through ``Llama.generate`` (its longest-prefix reuse decides what it evaluates): its
        prompt evaluated, the sampled token never fed. Returns (calls, tokens) counted around ``Llama.eval``."""
        seen = [0, 0]
        engine_eval = self.llm.eval

        def counting(tokens: Sequence[int]) -> None:
            seen[0] += -(-len(tokens) // N_BATCH) if tokens else 0
            seen[1] += len(tokens)
            engine_eval(tokens)

        self.llm.eval = counting  # type: ignore[method-assign]
        try:
            gen = self.llm.generate(ids, temp=0.0, top_k=1, reset=True)
            next(gen)
            gen.close()
        finally:
            del self.llm.eval
        return seen[0], seen[1]


@contextmanager
def _extra_bufts(on: bool) -> Iterator[None]:
    """``Llama()`` takes no ``use_extra_bufts``: it reads ``llama_model_default_params()``, which is wrapped
    for the load when they are turned off."""
    if on:
        yield
        return
    from llama_cpp import llama_cpp as low

    default = low.llama_model_default_params

    def params() -> Any:
        p = default()
        p.use_extra_bufts = False
        return p

    low.llama_model_default_params = params
    try:
        yield
    finally:
        low.llama_model_default_params = default


def _identity(spec: str, file: Path, llm: Any, lc: Any) -> dict[str, Any]:
    """The GGUF's identity, keyed as the transformers backend keys a GGUF
    (:func:`pytest_kvaudit.core.runtime.gguf.identity`: the digest covers the file's sha256), read from the metadata
    llama.cpp already parsed (the ``gguf`` package takes seconds over the tensor table), and named as run natively: not
    dequantized."""
    import hashlib
    import json

    meta = dict(llm.metadata)
    arch = str(meta.get("general.architecture", "unknown"))
    ftypes = {v: k.removeprefix("LLAMA_FTYPE_MOSTLY_").removeprefix("LLAMA_FTYPE_")
              for k, v in vars(lc).items() if k.startswith("LLAMA_FTYPE_") and isinstance(v, int)}
    ftype = meta.get("general.file_type")
    digest = file_digest(file)
    return {
        "id": spec, "architecture": _causal_lm_class(arch), "model_type": arch,
        "num_layers": int(meta.get(f"{arch}.block_count", 0) or 0),
        "weights_digest": "sha256:" + hashlib.sha256(file.name.encode() + b"\0" + digest.encode()).hexdigest(),
        "config_digest": "sha256:" + hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest(),
        "gguf": {"file": file.name,
                 "quantization": ftypes.get(int(ftype), str(ftype)) if ftype is not None else "unknown",
                 "dequantized": False},
        "backend": NAME,
    }


def open_spec(spec: OpenSpec) -> LlamaCppBackend:
    """The llama.cpp engine's opener (:attr:`pytest_kvaudit.core.engine.record.EngineSpec.opener`)."""
    _llama_cpp()  # the engine missing is the first thing to say
    if spec.device not in ("auto", "cpu"):
        raise KvauditError(f"--kvaudit-device={spec.device}: the {NAME} backend runs on the CPU here (one thread)")
    file = gguf_file(Path(spec.model).expanduser())
    if file is None:
        raise KvauditError(f"--kvaudit-backend={NAME} runs GGUF files: {spec.model!r} is not a .gguf or a folder "
                           "holding one")
    return LlamaCppBackend(file, spec.dtype, spec.model)

