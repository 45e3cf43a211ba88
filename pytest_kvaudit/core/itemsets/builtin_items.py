"""The built-in item sets, for checkpoints that ship no ``items.jsonl``, chosen by name.

A checkpoint without items gets :data:`BUILTIN_CHAT_DEFAULT` (``builtin:arith-v3``, one-shot word problems a
small instruct model answers about half the time: see ``builtin_arith_v3``) when its prompts go through a chat
template, else :data:`BUILTIN_DEFAULT` (``builtin:arith-v2``, two-step problems with an instruction: see
``builtin_arith_v2``); ``--kvaudit-items=builtin:arith-v1`` picks the
older set described here, kept because ledgers were recorded on it. A set's name carries its version: a
change to its items is a new name, never a new digest under the old one.

``builtin:arith-v1``:

A checkpoint without an item set must still get a run whose figures mean the same on every machine,
so the items are generated, not sampled at run time: a ``random.Random(0)`` stream drawn in a fixed
order, which Python guarantees to reproduce across platforms and versions. The prompts are short
plain-ASCII arithmetic questions (any tokenizer encodes them, none needs a special token), each in the
same ``Q: ...`` / ``A:`` shape so that the first integer a model writes is its answer. The boundary is a
token offset, ``tokens:8``, because a marker such as ``</think>`` is one that most checkpoints never
write: every trajectory that generates eight tokens reaches it, so no item is ineligible for want of a
marker.

Importing this module is cheap (no torch, no pytest): the plugin may build the set while collecting.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.itemsets import arith_v2 as v2
from pytest_kvaudit.core.itemsets import arith_v3 as v3
from pytest_kvaudit.core.model.items import Item, ItemSet

#: How reports and ledgers name this set; bump the version whenever the generated items change.
BUILTIN_NAME = "builtin:arith-v1"
#: ``ItemSet.path`` of the built-in set: not a file, but a name that reads as one in messages.
BUILTIN_PATH = Path(f"<{BUILTIN_NAME}>")
#: Items in the set when no count is asked for.
BUILTIN_SIZE = 64
#: The set a checkpoint without items gets.
BUILTIN_DEFAULT = v2.NAME
#: ... when its prompts go through a chat template: one-shot problems a small instruct model answers about half
#: the time (``builtin_arith_v3``); v2 stays the default elsewhere, so its ledgers keep their item set
BUILTIN_CHAT_DEFAULT = v3.NAME
#: The most items the generator is asked for; every kind of question still has unused prompts there.
BUILTIN_MAX = 1000
#: A token offset every model reaches, since it counts generated tokens rather than looking for text.
BUILTIN_BOUNDARY = "tokens:8"
#: Room for the answer and some continuation after the boundary, without long decodes on a CPU.
BUILTIN_MAX_NEW_TOKENS = 32
#: The first integer the model writes: every prompt ends in ``A:``, so that is where the answer goes.
BUILTIN_ANSWER_REGEX = r"(-?\d+)"


def _add(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"Q: {a} + {b} = ?\nA:", a + b


def _sub(rng: random.Random) -> tuple[str, int]:
    a = rng.randint(20, 99)
    b = rng.randint(1, a)
    return f"Q: {a} - {b} = ?\nA:", a - b


def _mul(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    return f"Q: {a} * {b} = ?\nA:", a * b


def _next(rng: random.Random) -> tuple[str, int]:
    start, step, length = rng.randint(0, 99), rng.randint(1, 9), rng.randint(4, 6)
    seq = " ".join(str(start + step * j) for j in range(length))
    return f"Q: what comes next: {seq} ?\nA:", start + step * length


#: Kinds in the order they take turns, so that any head of the set mixes all of them.
_KINDS: tuple[tuple[str, Callable[[random.Random], tuple[str, int]]], ...] = (
    ("add", _add), ("sub", _sub), ("mul", _mul), ("next", _next),
)


def _generate(count: int) -> tuple[Item, ...]:
    """The first ``count`` items of one fixed stream: a longer set starts with every shorter one.

    A prompt drawn twice is drawn again (the set holds no duplicate prompt); the redraw consumes the
    same stream, so this does not break the prefix property.
    """
    rng = random.Random(0)
    seen: set[str] = set()
    items: list[Item] = []
    while len(items) < count:
        i = len(items)
        kind, draw = _KINDS[i % len(_KINDS)]
        prompt, answer = draw(rng)
        if prompt in seen:
            continue
        seen.add(prompt)
        items.append(Item(id=f"arith-{i:04d}-{kind}", answer=str(answer), prompt=prompt))
    return tuple(items)


@dataclass(frozen=True)
class BuiltinSet:
    """One built-in set: its generator (``count`` -> the first ``count`` items) and its rules."""

    generate: Callable[[int], tuple[Item, ...]]
    size: int
    boundary: str
    answer_regex: str
    max_new_tokens: int
    stop_regex: str | None = None


#: every built-in set by the name ``--kvaudit-items`` and the report's ``items.set`` use
BUILTIN_SETS: dict[str, BuiltinSet] = {
    BUILTIN_NAME: BuiltinSet(_generate, BUILTIN_SIZE, BUILTIN_BOUNDARY, BUILTIN_ANSWER_REGEX, BUILTIN_MAX_NEW_TOKENS),
    v2.NAME: BuiltinSet(v2.generate, v2.SIZE, v2.BOUNDARY, v2.ANSWER_REGEX, v2.MAX_NEW_TOKENS),
    v3.NAME: BuiltinSet(v3.generate, v3.SIZE, v3.BOUNDARY, v3.ANSWER_REGEX, v3.MAX_NEW_TOKENS, v3.STOP_REGEX),
}


def is_builtin(spec: str | None) -> bool:
    """``--kvaudit-items`` names a built-in set (``builtin:NAME``, or ``<builtin:NAME>`` as a partial records it)."""
    return bool(spec) and str(spec).strip("<>").startswith("builtin:")


def builtin_item_set(n: int | None = None, name: str = BUILTIN_DEFAULT) -> ItemSet:
    """The built-in set ``name``'s first ``n`` items (its own size when ``n`` is None), identical everywhere.

    ``n`` may exceed the set's size (up to ``BUILTIN_MAX``) because the items come from a generator:
    ``--kvaudit-n=200`` on a checkpoint without items should run 200 units, not fail.
    """
    name = name.strip("<>")
    if name not in BUILTIN_SETS:
        raise KvauditError(f"--kvaudit-items={name}: no such built-in item set; built-in sets: "
                           f"{', '.join(BUILTIN_SETS)}")
    spec = BUILTIN_SETS[name]
    count = spec.size if n is None else n
    if count < 1:
        raise KvauditError(f"--kvaudit-n={count}: must be at least 1")
    if count > BUILTIN_MAX:
        raise KvauditError(
            f"--kvaudit-n={count} but the built-in item set ({name}) holds at most {BUILTIN_MAX} items: "
            "lower --kvaudit-n or pass --kvaudit-items=FILE.jsonl"
        )
    return ItemSet(path=Path(f"<{name}>"), items=spec.generate(count), boundary=spec.boundary,
                   answer_regex=spec.answer_regex, max_new_tokens=spec.max_new_tokens, stop_regex=spec.stop_regex)
