"""The transformers engine's record (:class:`~pytest_kvaudit.core.model.engines.EngineSpec`), declared as the
``transformers`` entry point of the ``kvaudit.engines`` group in ``pyproject.toml``."""

from __future__ import annotations

from pytest_kvaudit.core.compute.cells import CellBuilder
from pytest_kvaudit.core.model.engines import EngineSpec
from pytest_kvaudit.core.planning.calibrate import forward_calibration
from pytest_kvaudit.core.runtime import state
from pytest_kvaudit.engines.transformers import backend

__all__ = ["TRANSFORMERS"]

TRANSFORMERS = EngineSpec("transformers", backend.open_spec, cell_builder=CellBuilder,
                          calibrator=forward_calibration, state_reader=state)
