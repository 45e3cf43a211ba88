"""The cache kinds kvaudit audits, by name (``--kvaudit-cache``): the exact layouts (``dynamic``, ``static``), the
offloaded ``DynamicCache`` and the lossy ones (transformers' ``QuantizedCache``: KIVI-style K/V quantization
through optimum-quanto, HQQ or FP8). Plain data and checks, known without torch, so a config is checked before
anything loads; making a cache of a kind is :mod:`pytest_kvaudit.core.runtime.state`.

A lossy kind is lossy by design, so it is never judged for exactness: it is audited against the exact
dynamic cache on the same prefix ids (does the continuation move, does the label change). The offloaded
kind moves each layer's K/V to the CPU between forwards and back: lossless by design, so it is judged for
exactness, bit for bit, but only where the model runs on a GPU; on a CPU it *is* the resident cache.

Spellings (``--kvaudit-cache``): ``quantized:quanto-int4``, ``quantized:quanto-int2``, ``quantized:hqq-int4``
(any of HQQ's 1, 2, 3, 4, 8 bits), ``quantized:fp8`` (no extra needed), ``offloaded``.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from typing import Any

from pytest_kvaudit.core.errors import KvauditError

QUANTIZED = "quantized"
OFFLOADED = "offloaded"
#: the exact layouts: ``dynamic`` (grows per token), ``static`` (preallocated to a maximum length, what users pair
#: with ``torch.compile``)
EXACT = ("dynamic", "static")
#: backend -> (module that must import, the pytest-kvaudit extra that installs it, the pip package)
EXTRAS = {"quanto": ("optimum.quanto", "quanto", "optimum-quanto"), "hqq": ("hqq", "hqq", "hqq")}
#: the bit widths each backend's transformers layer accepts
NBITS = {"quanto": (2, 4), "hqq": (1, 2, 3, 4, 8)}
#: why the offloaded kind says nothing off a GPU
OFFLOAD_NOT_MEANINGFUL = ("offloaded cache not audited on {device}: offloading moves K/V to the CPU between "
                          "forwards, so on a {device} device it is the resident cache (bit-exactness is checked "
                          "where the model runs on CUDA)")


@dataclass(frozen=True)
class LossySpec:
    """One quantized cache: the backend and its bit width (None for FP8, which has one)."""

    backend: str
    nbits: int | None

    @property
    def name(self) -> str:
        return f"{QUANTIZED}:{self.backend}" + (f"-int{self.nbits}" if self.nbits is not None else "")


def parse_lossy(kind: str) -> LossySpec | None:
    """The spec of a ``quantized:...`` kind; None for any other kind; a one-line error when malformed."""
    head, sep, rest = kind.partition(":")
    if head != QUANTIZED:
        return None
    if rest == "fp8":
        return LossySpec("fp8", None)
    m = re.fullmatch(r"(quanto|hqq)-int([0-9])", rest)
    if not sep or m is None:
        raise KvauditError(f"--kvaudit-cache: {kind!r} is not a quantized cache; use quantized:quanto-int4, "
                           "quantized:quanto-int2, quantized:hqq-int4 or quantized:fp8")
    backend, nbits = m.group(1), int(m.group(2))
    if nbits not in NBITS[backend]:
        raise KvauditError(f"--kvaudit-cache: {kind!r}: {backend} quantizes K/V to "
                           f"{', '.join(map(str, NBITS[backend]))} bits, not {nbits}")
    return LossySpec(backend, nbits)


def is_lossy(kind: str) -> bool:
    return kind.startswith(QUANTIZED + ":")


def check_extra(spec: LossySpec) -> None:
    """Refuse, in one line naming the extra to install, a backend whose package is missing (before any work)."""
    if spec.backend not in EXTRAS:
        return
    module, extra, package = EXTRAS[spec.backend]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package (optimum) is missing
        found = False
    if not found:
        raise KvauditError(f"--kvaudit-cache={spec.name} needs {package}: pip install 'pytest-kvaudit[{extra}]'")


def check_kind(kind: str) -> None:
    """A lossy or relocated kind that this environment can make (the extra is installed), else one line."""
    spec = parse_lossy(kind)
    if spec is not None:
        check_extra(spec)


def known_kind(kind: str) -> bool:
    """Whether ``kind`` names a cache kind (a ``quantized:`` one is checked further by :func:`parse_lossy`)."""
    return kind in (*EXACT, OFFLOADED) or is_lossy(kind)


def offload_not_meaningful(device: Any) -> str | None:
    """Why the offloaded kind is no audit on ``device`` (anything but CUDA), or None where it is one."""
    kind = getattr(device, "type", str(device).split(":")[0])
    return None if kind == "cuda" else OFFLOAD_NOT_MEANINGFUL.format(device=kind)
