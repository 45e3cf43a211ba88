"""The llama.cpp engine's record (:class:`~pytest_kvaudit.core.engine.record.EngineSpec`), declared as the
``llama.cpp`` entry point of the ``kvaudit.engines`` group in ``pyproject.toml``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.core.engine.record import EngineSpec
from pytest_kvaudit.core.model.engine_constructions import RESTORE, WARM
from pytest_kvaudit.engines.llama_cpp import backend

__all__ = ["LLAMA_CPP"]


def _llamacpp_lines(env: Mapping[str, Any]) -> list[str]:
    """The engine that ran the model, its K/V cache types, and what it cannot do."""
    if not env.get("llama_cpp_python"):
        return []
    kvt = ", ".join(f"{d} {t}" for d, t in env.get("kv_cache_type", {}).items())
    return [f"backend llama.cpp (llama-cpp-python {env['llama_cpp_python']}), K/V cache {kvt}; not available: "
            f"{', '.join(env.get('not_available', [])) or 'none'}"]


LLAMA_CPP = EngineSpec(backend.NAME, backend.open_spec, constructions=(WARM, RESTORE),
                       lacks=frozenset({"per_layer", "layer_sweep", "batch_invariance"}),
                       precisions=tuple(backend.KV_TYPES),
                       report_lines=_llamacpp_lines, cache_kinds=())
