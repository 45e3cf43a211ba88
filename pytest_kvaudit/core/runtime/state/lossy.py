"""Making the cache kinds beyond the exact layouts (:mod:`pytest_kvaudit.core.model.cache_kinds` names them):
a lossy ``QuantizedCache`` and the offloaded ``DynamicCache``."""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.model.cache_kinds import check_extra, offload_not_meaningful, parse_lossy


def quantized(model: Any, kind: str) -> Any:
    """A fresh ``QuantizedCache`` for ``kind`` with transformers' own defaults (group 64, residual 128: the
    cache users get, so the audit judges what they run)."""
    from transformers import QuantizedCache

    spec = parse_lossy(kind)
    assert spec is not None
    check_extra(spec)
    if spec.nbits is None:  # fp8 takes no group-wise options
        return QuantizedCache(spec.backend, config=model.config)
    return QuantizedCache(spec.backend, config=model.config, nbits=spec.nbits)


def offloaded(model: Any) -> Any:
    """A fresh ``DynamicCache`` that offloads each layer to the CPU and prefetches it back (CUDA only)."""
    from transformers import DynamicCache

    why = offload_not_meaningful(model.device)
    if why is not None:
        raise UnsupportedCacheError(why)
    return DynamicCache(config=model.config, offloading=True)
