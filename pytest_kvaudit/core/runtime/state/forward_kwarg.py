"""The name a model's forward takes its cache under: one question of transformers' signature, asked once per
model class, apart from the state adapters so that a decode step can ask it without importing them."""

from __future__ import annotations

import inspect
from typing import Any

_CACHE_KWARG: dict[type, str] = {}


def cache_kwarg(model: Any) -> str:
    """The name the model's forward takes its cache under (``cache`` in 5.x, ``past_key_values`` before)."""
    cls = type(model)
    if cls not in _CACHE_KWARG:
        params = inspect.signature(cls.forward).parameters
        _CACHE_KWARG[cls] = "cache" if "cache" in params else "past_key_values"
    return _CACHE_KWARG[cls]
