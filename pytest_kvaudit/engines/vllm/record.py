"""The vLLM engine's record (:class:`~pytest_kvaudit.core.engine.record.EngineSpec`), declared as the ``vllm``
entry point of the ``kvaudit.engines`` group in ``pyproject.toml``. A request-level engine: its cells, hits and
transplants are the core's shared request-level machinery (:mod:`pytest_kvaudit.core.requests`) over its backend."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.core.engine.record import EngineSpec
from pytest_kvaudit.core.model.engine_constructions import BATCHED, WARM
from pytest_kvaudit.core.model.engine_protocol import OpenSpec, RequestPrice
from pytest_kvaudit.core.requests import arithmetic, calibrate, state
from pytest_kvaudit.engines.vllm import backend, lossy, settings
from pytest_kvaudit.engines.vllm.cells import VllmCellBuilder
from pytest_kvaudit.engines.vllm.engine import DEFAULT_ENGINE_ARGS

__all__ = ["BLOCK", "VLLM", "request_price", "request_price_for"]

#: the block size kvaudit's vLLM engine runs unless ``--kvaudit-engine-arg block_size=N`` says otherwise
BLOCK = int(DEFAULT_ENGINE_ARGS["block_size"])


def _open_vllm(spec: OpenSpec) -> Any:
    """vLLM's backend (request level: it serves requests, so it is not the forward-level ``Backend``)."""
    s, extra = spec, {"engine_args": dict(spec.engine_args)} if spec.engine_args else {}
    return backend.open_backend(s.model, s.dtype, s.device, s.attn, s.trust_remote_code, s.allow_pickle,
                                s.device_map, **extra)


def request_price(name: str, prompt: int, head: int, suffix: int, budget: int) -> tuple[int, int] | None:
    """The plan's price of vLLM's requests (:func:`pytest_kvaudit.core.requests.arithmetic.request_price`) on its
    default blocks."""
    return arithmetic.request_price(name, prompt, head, suffix, budget, BLOCK)


def request_price_for(engine_args: tuple[tuple[str, str], ...]) -> RequestPrice:
    """The price on the blocks the run gives vLLM (``--kvaudit-engine-arg block_size=N``; vLLM's own config has
    checked the value at configure)."""
    given = dict(engine_args).get("block_size")
    block = int(given) if given is not None and given.strip().isdigit() else BLOCK
    return lambda name, prompt, head, suffix, budget: arithmetic.request_price(name, prompt, head, suffix, budget,
                                                                               block)


VLLM = EngineSpec(backend.NAME, _open_vllm, level="request", constructions=(WARM, BATCHED + "({batch})"),
                  lacks=frozenset({"layer_sweep", "batch_invariance"}), cell_builder=VllmCellBuilder,
                  calibrator=calibrate.calibrate, state_reader=state, request_price=request_price,
                  request_price_for=request_price_for,
                  cache_kinds=(lossy.KIND,), cache_probe=lossy.cache_probe, cache_kinds_said=lossy.SAID,
                  engine_arg_keys=None,  # any vllm.LLM / EngineArgs argument, checked by its own config:
                  check_settings=settings.check_settings)
