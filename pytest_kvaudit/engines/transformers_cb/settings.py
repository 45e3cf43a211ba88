"""transformers-cb's own settings (``--kvaudit-engine-arg KEY=VALUE``) and the transformers it needs.

Each key is one field of transformers' ``ContinuousBatchingConfig``, and every bad value is refused in one line that
names the key and what to give, before anything is loaded. kvaudit sets ``num_blocks`` and ``max_batch_tokens``
itself unless told otherwise: transformers' own default sizes the cache from free memory, which on a CPU takes
60% of RAM (gigabytes of cache and a multi-GiB attention mask) for an audit that holds a few hundred positions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_kvaudit.core.errors import KvauditError

NAME = "transformers-cb"
#: the transformers this engine was written against: it reads the continuous-batching internals of this release
WRITTEN_FOR = "5.25.0"
#: the oldest transformers whose continuous batching has what the engine reads (page_size, cache_allocators,
#: search_prefix_match, the pause window); older ones are refused at configure, in one line
MINIMUM = (5, 25)
INSTALL = "pip install 'transformers>=5.25,<6'"
#: transformers refuses smaller pages (``initialization.BOUNDS['page_size']``)
MIN_PAGE = 4


@dataclass(frozen=True)
class CbSettings:
    """What decides this engine's schedule and sharing, each recorded in the ledger and compared by the gate."""

    #: tokens per page (transformers' default is 256; small pages let short items hit whole blocks)
    page_size: int = 16
    #: the cache's capacity in whole-model blocks of ``page_size`` tokens
    num_blocks: int = 256
    #: the scheduler's token budget per engine step (a prefill longer than this is chunked)
    max_batch_tokens: int = 512
    #: transformers' prefix block sharing (on by default, as every user of ``generate_batch`` runs it)
    allow_block_sharing: bool = True
    #: the FIFO scheduler's free-cache margin under which it evicts every cached block (transformers: 0.15)
    safety_margin: float = 0.15

    @property
    def positions(self) -> int:
        return self.page_size * self.num_blocks

    def as_dict(self) -> dict[str, Any]:
        return {"page_size": self.page_size, "num_blocks": self.num_blocks, "max_batch_tokens": self.max_batch_tokens,
                "allow_block_sharing": self.allow_block_sharing, "safety_margin": self.safety_margin}


KEYS = frozenset(CbSettings().as_dict())
_SAID = {"page_size": f"a whole number of tokens per page, at least {MIN_PAGE}",
         "num_blocks": "a whole number of blocks, at least 1",
         "max_batch_tokens": "a whole number of tokens, at least 1",
         "allow_block_sharing": "true or false", "safety_margin": "a fraction in [0, 1)"}


def _value(key: str, text: str) -> Any:
    t = text.strip().lower()
    bad = KvauditError(f"--kvaudit-engine-arg {key}={text}: {NAME} takes {_SAID[key]}")
    if key == "allow_block_sharing":
        if t not in ("true", "false"):
            raise bad
        return t == "true"
    try:
        v: Any = float(t) if key == "safety_margin" else int(t)
    except ValueError:
        raise bad from None
    low = MIN_PAGE if key == "page_size" else 1
    if key == "safety_margin" and not 0.0 <= v < 1.0 or key != "safety_margin" and v < low:
        raise bad
    return v


def parse(args: Mapping[str, str] | tuple[tuple[str, str], ...]) -> CbSettings:
    """The settings from ``--kvaudit-engine-arg`` pairs over kvaudit's defaults; an unknown key or a bad value is one
    line naming it."""
    given = dict(args.items()) if isinstance(args, Mapping) else dict(args)
    out: dict[str, Any] = {}
    for key, text in sorted(given.items()):
        if key not in KEYS:
            raise KvauditError(f"--kvaudit-engine-arg {key}=...: {NAME} takes {', '.join(sorted(KEYS))} (fields of "
                               "transformers' ContinuousBatchingConfig); kvaudit sets the rest itself")
        out[key] = _value(key, text)
    return CbSettings(**out)


def check_version() -> str:
    """The installed transformers' version, or one line saying which this engine needs."""
    import transformers

    v = transformers.__version__
    try:
        got = tuple(int(x) for x in v.split(".")[:2])
    except ValueError:
        got = MINIMUM  # a development build: the internals are checked one by one when the engine opens
    if got < MINIMUM:
        raise KvauditError(f"--kvaudit-backend={NAME} reads transformers' continuous batching as of "
                           f"{'.'.join(map(str, MINIMUM))} (installed: {v}); {INSTALL}")
    return v


def internal(obj: Any, path: str) -> Any:
    """``obj.a.b.c`` for ``path`` "a.b.c", or one line naming the transformers name that moved."""
    for part in path.split("."):
        if not hasattr(obj, part):
            import transformers

            raise KvauditError(f"transformers {transformers.__version__} has no {type(obj).__name__}.{part} (reading "
                               f"{path}): the {NAME} backend reads continuous batching's internals as of "
                               f"transformers=={WRITTEN_FOR}; install that version")
        obj = getattr(obj, part)
    return obj


def check_settings(cfg: Any) -> None:
    """The run's config as this engine takes it (called once at configure): the transformers version and every
    ``--kvaudit-engine-arg``."""
    check_version()
    parse(tuple(getattr(cfg, "engine_args", ()) or ()))
