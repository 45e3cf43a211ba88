"""Every precision and K/V cache type ``--kvaudit-dtypes`` takes, declared once: its name, the aliases a user may
type, the torch dtype a torch engine runs it in, the bytes one K/V value (or weight) takes, and whether its
rounding is coarse enough that live and prefill are expected to differ (an engine's own name for each, llama.cpp's
ggml cache types for one, lives in the engine's folder).

Before this table the same facts lived in five places (the parser's aliases, the loader's torch names, vLLM's
copy of them, llama.cpp's cache types and the plan's byte sizes), and the plan's lacked ``q8_0``: a llama.cpp
run at ``q8_0`` priced its memory with a ``KeyError``. Plain data: no torch, no engine."""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from pytest_kvaudit.core.errors import KvauditError

__all__ = ["PRECISIONS", "Precision", "aliases", "low_precision", "named", "parse_dtypes", "torch_precisions"]


@dataclass(frozen=True)
class Precision:
    """One value of ``--kvaudit-dtypes``."""

    name: str
    #: what a user may type for it besides ``name`` (lower case)
    aliases: tuple[str, ...]
    #: the ``torch`` dtype attribute it runs in (``"bfloat16"``); None for a K/V cache type no torch engine runs
    torch: str | None
    #: bytes per K/V value and per weight at this precision (q8_0: 34-byte blocks of 32 values)
    bytes: Fraction
    #: rounding coarse enough that live and prefill caches are expected to differ (the 2x2's low side)
    low: bool

    def nbytes(self, values: int) -> int:
        """Bytes that ``values`` K/V values (or weights) take, rounded up to a whole byte."""
        return math.ceil(values * self.bytes)


#: the table, in the order the options list them
PRECISIONS: tuple[Precision, ...] = (
    Precision("bf16", ("bfloat16",), "bfloat16", Fraction(2), True),
    Precision("fp16", ("float16", "half"), "float16", Fraction(2), True),
    Precision("fp32", ("float32", "float"), "float32", Fraction(4), False),
    # a K/V cache type, not a compute dtype: an 8-bit quantized cache (llama.cpp's; refused by torch engines)
    Precision("q8_0", (), None, Fraction(34, 32), True),
)
_BY_NAME = {p.name: p for p in PRECISIONS}
_ALIASES = {a: p.name for p in PRECISIONS for a in (p.name, *p.aliases)}


def named(name: str) -> Precision:
    """The precision called ``name`` (a canonical name: :func:`parse_dtypes` resolves aliases)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KvauditError(f"--kvaudit-dtypes: unknown precision {name!r}; use {', '.join(_BY_NAME)}") from None


def aliases() -> dict[str, str]:
    """Every spelling ``--kvaudit-dtypes`` accepts -> its canonical name."""
    return dict(_ALIASES)


def torch_precisions() -> tuple[str, ...]:
    """The precisions a torch engine runs (transformers, vLLM)."""
    return tuple(p.name for p in PRECISIONS if p.torch is not None)


def low_precision() -> frozenset[str]:
    return frozenset(p.name for p in PRECISIONS if p.low)


def parse_dtypes(text: str | list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """``--kvaudit-dtypes``: a comma list of names or aliases -> canonical names, in order, each once."""
    parts = [p.strip().lower() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    if not parts:
        raise KvauditError("--kvaudit-dtypes is empty: give a comma list such as bf16,fp32")
    out: list[str] = []
    for p in parts:
        if p not in _ALIASES:
            raise KvauditError(f"--kvaudit-dtypes: unknown precision {p!r}; use {', '.join(_BY_NAME)}")
        if _ALIASES[p] not in out:
            out.append(_ALIASES[p])
    return tuple(out)
