"""vLLM's own settings (``--kvaudit-engine-arg KEY=VALUE``) checked once at configure, before an engine opens:
each one the audit cannot run ends in one line naming the setting and vLLM's reason, never a traceback.

- a key vLLM's ``EngineArgs`` lacks, a key the audit sets itself, ``batch_invariant`` on a CPU
  (:func:`.engine.engine_kwargs`);
- every value as vLLM's own config takes it (``EngineArgs(...).create_engine_config()``, what ``vllm.LLM`` runs
  first): a value of the wrong type, a memory fraction above 1, a tensor-parallel size the heads do not divide, a
  ``max_model_len`` above the model's. vLLM's refusals are pydantic's, whose last line is a URL:
  :func:`.engine.said` keeps the reason (the field, the message, the value given);
- a block size the attention backend that vLLM picks for this model refuses (CPU_ATTN takes multiples of 32),
  which vLLM itself finds only once the weights are loaded;
- a ``max_model_len`` shorter than every item (prompt and ``max_new_tokens``): each item would be ineligible and the
  run would judge nothing.

A setting vLLM takes that only changes the schedule (``max_num_batched_tokens=32``: a small token budget per
step, the prompts prefilled in chunks) passes, and the audit runs on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.engines.vllm.engine import ARG, DTYPES, NAME, engine_kwargs, load_vllm, refusal


def check_settings(cfg: Any) -> None:
    """The run's ``--kvaudit-engine-arg`` settings as vLLM takes them, before any engine opens (see the module's
    docstring); a run that gives none has nothing to refuse."""
    args = dict(cfg.engine_args)
    if not args:
        return
    load_vllm()
    from vllm.platforms import current_platform

    kwargs, _ = engine_kwargs(args, current_platform.is_cpu())
    path = Path(cfg.model).expanduser()
    dtype = next((DTYPES[d] for d in cfg.dtypes if d in DTYPES), None)
    if not path.is_dir() or dtype is None:
        return  # the opener names what is wrong with the model or the precision
    from vllm.engine.arg_utils import EngineArgs

    try:
        config = EngineArgs(model=str(path), dtype=dtype, enable_prefix_caching=True, logprobs_mode="raw_logits",
                            seed=0, trust_remote_code=cfg.trust_remote_code, **kwargs).create_engine_config()
    except (ValueError, TypeError, NotImplementedError, RuntimeError) as exc:
        raise refusal(args, exc) from None
    if "block_size" in args:
        _block_size(config, args)
    if "max_model_len" in args:
        _fits(cfg, path, int(config.model_config.max_model_len))


def _block_size(config: Any, args: dict[str, str]) -> None:
    """The block size against the attention backend vLLM picks for this model (the engine checks it only after
    loading the weights)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    mc, block = config.model_config, int(config.cache_config.block_size)
    try:
        with set_current_vllm_config(config):
            backend = get_attn_backend(mc.get_head_size(), mc.dtype, config.cache_config.cache_dtype)
        sizes = [f"multiples of {x.base}" if hasattr(x, "base") else str(x)
                 for x in backend.get_supported_kernel_block_sizes()]
        ok = backend.supports_block_size(block)
    except Exception:  # vLLM's selector moved: the engine's own refusal, when it opens, is one line all the same
        return
    if not ok:
        raise KvauditError(f"{ARG} block_size={args['block_size']}: vLLM's attention backend {backend.get_name()} "
                           f"takes block sizes of {' or '.join(sizes)}, not {block}")


def _fits(cfg: Any, path: Path, limit: int) -> None:
    """A ``max_model_len`` shorter than every item's prompt and ``max_new_tokens``: refused (one item that fits is
    enough; the others are ineligible, as with the model's own limit)."""
    from pytest_kvaudit.core.compute.cells import chars_per_token, prompt_ids, surely_too_long
    from pytest_kvaudit.core.runtime.itemcheck import resolve
    from pytest_kvaudit.core.runtime.loading import load_tokenizer

    resolved, iset = resolve(cfg)
    tok = load_tokenizer(path, cfg.trust_remote_code)
    per_token, need = chars_per_token(tok), None
    for it in iset.items:
        if surely_too_long(it, per_token, limit):
            continue
        n = len(prompt_ids(it, tok, resolved.chat_template)) + iset.max_new_tokens
        if n <= limit:
            return
        need = n if need is None else min(need, n)
    shortest = f"the shortest needs {need}" if need is not None else "each prompt alone is longer"
    raise KvauditError(f"{ARG} max_model_len={limit}: shorter than every one of the {len(iset.items)} items "
                       f"({shortest} positions: its prompt and max_new_tokens {iset.max_new_tokens}), so none "
                       f"could be judged; raise it or leave it out ({NAME} takes the model's own limit)")
