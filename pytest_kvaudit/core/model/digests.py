"""The fingerprint hash, and the fingerprint of a run of token ids: what a ledger records of a prefix and what a
tensor's fingerprint is built on (:mod:`pytest_kvaudit.core.runtime.state.tensors`). Plain bytes, no torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def digest(tag: bytes = b"") -> Any:
    """The fingerprint hash: XXH3-128 (xxhash), tens of GB/s, so fingerprints cost about a memory copy.
    It is not cryptographic: it detects any change of the bytes, it does not resist a forger."""
    import xxhash

    h = xxhash.xxh3_128()
    h.update(tag)
    return h


def fingerprint_ids(ids: Sequence[int]) -> str:
    h = digest(b"ids")
    h.update(",".join(str(int(i)) for i in ids).encode())
    return str(h.hexdigest())
