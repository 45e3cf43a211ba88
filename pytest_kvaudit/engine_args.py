"""``--kvaudit-engine-arg KEY=VALUE`` (repeatable; ini twin ``kvaudit_engine_arg``, one pair a line): arguments
passed as given to an engine that takes them (vLLM's ``LLM``), read and checked at configure time. What each
value means is the engine's to say (:func:`pytest_kvaudit.core.runtime.backends.vllm_engine.engine_kwargs`
checks the keys against vLLM's own ``EngineArgs`` when the engine loads)."""

from __future__ import annotations

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import parse_engine_args
from pytest_kvaudit.core.model.schedules import extra_constructions
from pytest_kvaudit.options import BACKEND, ENGINE_ARG, ENGINE_ARGS_INI


def engine_args(config: pytest.Config, backend: str) -> tuple[tuple[str, str], ...]:
    """``--kvaudit-engine-arg`` pairs (or the ini's lines), checked: only vLLM takes them, and a vLLM run runs no
    registered chunk schedule (its constructions are requests, not forwards on a caller's cache)."""
    given = config.getoption("kvaudit_engine_arg")
    pairs = parse_engine_args(given or config.getini(ENGINE_ARGS_INI), ENGINE_ARG if given
                              else f"{ENGINE_ARGS_INI} (ini)")
    if pairs and backend != "vllm":
        raise KvauditError(f"{ENGINE_ARG} passes arguments to vllm.LLM: it needs {BACKEND}=vllm "
                           f"(this run is {backend})")
    if backend == "vllm" and (extra := extra_constructions()):
        raise KvauditError(f"{BACKEND}=vllm serves requests: the registered schedule(s) {', '.join(extra)} are chunk "
                           "schedules of forwards, which vLLM cannot run; unregister them for this run")
    return pairs
