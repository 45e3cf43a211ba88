"""The project's one error type: a single line that names the thing that is wrong and the fix."""

from __future__ import annotations


class KvauditError(Exception):
    """Bad input or an impossible request. ``str(err)`` is one line, fit for a terminal."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class UnsupportedCacheError(KvauditError):
    """The model's cache holds more than plain per-layer K/V (recurrent, hybrid) or none at all."""
