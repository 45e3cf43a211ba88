"""The three engines kvaudit ships, each one :class:`~pytest_kvaudit.core.model.engines.EngineSpec`, declared
as entry points of the ``kvaudit.engines`` group in ``pyproject.toml`` exactly as a third party's engine would
be. They live here, at the top of the core, because a record holds an engine's opener (runtime), its cell
builder (compute) and its calibrator (planning); the registry below them names none of these modules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_kvaudit.core.compute import vllm_lossy, vllm_requests
from pytest_kvaudit.core.compute.cells import CellBuilder
from pytest_kvaudit.core.compute.vllm_cells import VllmCellBuilder
from pytest_kvaudit.core.model.engine_constructions import BATCHED, RESTORE, WARM
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.model.engines import EngineSpec
from pytest_kvaudit.core.model.precisions import PRECISIONS
from pytest_kvaudit.core.planning import vllm_calibrate
from pytest_kvaudit.core.planning.calibrate import forward_calibration
from pytest_kvaudit.core.runtime import state
from pytest_kvaudit.core.runtime.backends import llamacpp, transformers, vllm, vllm_state

__all__ = ["LLAMA_CPP", "TRANSFORMERS", "VLLM"]


def _llamacpp_lines(env: Mapping[str, Any]) -> list[str]:
    """The engine that ran the model, its K/V cache types, and what it cannot do."""
    if not env.get("llama_cpp_python"):
        return []
    kvt = ", ".join(f"{d} {t}" for d, t in env.get("kv_cache_type", {}).items())
    return [f"backend llama.cpp (llama-cpp-python {env['llama_cpp_python']}), K/V cache {kvt}; not available: "
            f"{', '.join(env.get('not_available', [])) or 'none'}"]


def _open_vllm(spec: OpenSpec) -> Any:
    """vLLM's backend (request level: it serves requests, so it is not the forward-level ``Backend``)."""
    s, extra = spec, {"engine_args": dict(spec.engine_args)} if spec.engine_args else {}
    return vllm.open_backend(s.model, s.dtype, s.device, s.attn, s.trust_remote_code, s.allow_pickle, s.device_map,
                             **extra)


TRANSFORMERS = EngineSpec("transformers", transformers.open_spec, cell_builder=CellBuilder,
                          calibrator=forward_calibration, state_reader=state)
LLAMA_CPP = EngineSpec(llamacpp.NAME, llamacpp.open_spec, constructions=(WARM, RESTORE),
                       lacks=frozenset({"per_layer", "layer_sweep", "batch_invariance"}),
                       precisions=tuple(p.name for p in PRECISIONS if p.ggml is not None),
                       cell_builder=CellBuilder, calibrator=forward_calibration, state_reader=state,
                       report_lines=_llamacpp_lines, cache_kinds=())
VLLM = EngineSpec(vllm.NAME, _open_vllm, level="request", constructions=(WARM, BATCHED + "({batch})"),
                  lacks=frozenset({"layer_sweep", "batch_invariance"}), cell_builder=VllmCellBuilder,
                  calibrator=vllm_calibrate.calibrate, state_reader=vllm_state,
                  request_price=vllm_requests.request_price, cache_kinds=(vllm_lossy.KIND,),
                  cache_probe=vllm_lossy.cache_probe, cache_kinds_said=vllm_lossy.SAID)
