"""The vLLM engine's record (:class:`~pytest_kvaudit.core.model.engines.EngineSpec`), declared as the ``vllm``
entry point of the ``kvaudit.engines`` group in ``pyproject.toml``."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.core.model.engine_constructions import BATCHED, WARM
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.model.engines import EngineSpec
from pytest_kvaudit.engines.vllm import backend, calibrate, lossy, requests
from pytest_kvaudit.engines.vllm import state as vllm_state
from pytest_kvaudit.engines.vllm.cells import VllmCellBuilder

__all__ = ["VLLM"]


def _open_vllm(spec: OpenSpec) -> Any:
    """vLLM's backend (request level: it serves requests, so it is not the forward-level ``Backend``)."""
    s, extra = spec, {"engine_args": dict(spec.engine_args)} if spec.engine_args else {}
    return backend.open_backend(s.model, s.dtype, s.device, s.attn, s.trust_remote_code, s.allow_pickle,
                                s.device_map, **extra)


VLLM = EngineSpec(backend.NAME, _open_vllm, level="request", constructions=(WARM, BATCHED + "({batch})"),
                  lacks=frozenset({"layer_sweep", "batch_invariance"}), cell_builder=VllmCellBuilder,
                  calibrator=calibrate.calibrate, state_reader=vllm_state,
                  request_price=requests.request_price, cache_kinds=(lossy.KIND,),
                  cache_probe=lossy.cache_probe, cache_kinds_said=lossy.SAID)
