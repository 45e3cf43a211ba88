"""The engine's record (:class:`~pytest_kvaudit.core.engine.record.EngineSpec`), the one thing its entry point
names (``transformers-cb`` in the ``kvaudit.engines`` group). A request-level engine: its cells, hits and
transplants are the core's shared request-level machinery (:mod:`pytest_kvaudit.core.requests`) over its backend."""

from __future__ import annotations

from pytest_kvaudit.core.engine.record import EngineSpec
from pytest_kvaudit.core.model.engine_constructions import BATCHED, WARM
from pytest_kvaudit.core.model.engine_protocol import RequestPrice
from pytest_kvaudit.core.requests import arithmetic, calibrate, state
from pytest_kvaudit.engines.transformers_cb.backend import open_spec
from pytest_kvaudit.engines.transformers_cb.cells import CbCellBuilder
from pytest_kvaudit.engines.transformers_cb.settings import KEYS, NAME, CbSettings, check_settings, parse

__all__ = ["CONTINUOUS_BATCHING", "request_price", "request_price_for"]

#: the page size the engine runs unless ``--kvaudit-engine-arg page_size=N`` says otherwise
PAGE = CbSettings().page_size


def request_price(name: str, prompt: int, head: int, suffix: int, budget: int) -> tuple[int, int] | None:
    """The plan's price of the engine's requests (:func:`pytest_kvaudit.core.requests.arithmetic.request_price`) on
    its default pages."""
    return arithmetic.request_price(name, prompt, head, suffix, budget, PAGE)


def request_price_for(engine_args: tuple[tuple[str, str], ...]) -> RequestPrice:
    """The price on the pages the run gives the engine (``--kvaudit-engine-arg page_size=N``, checked at
    configure)."""
    page = parse(engine_args).page_size
    return lambda name, prompt, head, suffix, budget: arithmetic.request_price(name, prompt, head, suffix, budget, page)


CONTINUOUS_BATCHING = EngineSpec(NAME, open_spec, level="request", constructions=(WARM, BATCHED + "({batch})"),
                             lacks=frozenset({"layer_sweep", "batch_invariance"}), precisions=("bf16", "fp16", "fp32"),
                             cell_builder=CbCellBuilder, calibrator=calibrate.calibrate, state_reader=state,
                             request_price=request_price, request_price_for=request_price_for, cache_kinds=(),
                             cache_kinds_said="transformers' paged cache holds the model's own dtype",
                             engine_arg_keys=KEYS, check_settings=check_settings)
