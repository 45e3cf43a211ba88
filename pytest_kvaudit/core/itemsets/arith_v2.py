"""``builtin:arith-v2``: two-step arithmetic that a small instruct model works through before answering.

v1 asked ``Q: a + b = ?`` with the boundary at eight generated tokens: a chat model answers in fewer (the
item is ineligible) or writes the answer inside the prefix (the label can never change). v2 asks for the
working: every problem takes two operations, and the prompt asks for each step and a last line
``Answer: <number>``. The boundary is the end of the first ``=`` the model writes: by then it has turned
the problem into arithmetic (restated the sum, or for a word problem chosen the operations), the first
stage of working, and every result, intermediate and final, still lies in the suffix, so a suffix that
diverges can change the extracted answer. SmolLM2-135M-Instruct (chat template, fp32) reaches the boundary
and yields an answer on the shares that ``tests/core/itemsets/test_builtin_items.py`` records.

The answer is the number after the last ``answer`` the model writes (``Answer: 81``, ``The answer is 81``),
else the last integer of the generation: small models often end on ``... = 81`` without the word.

Deterministic like v1: one ``random.Random(2)`` stream drawn in a fixed order, plain ASCII, no torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pytest_kvaudit.core.model.items import Item

NAME = "builtin:arith-v2"
#: the paper's unit count: the FP32 bound at 2% needs 183 units at 0 disagreements (Clopper-Pearson)
SIZE = 200
#: after the model's first ``=``: the problem is restated as arithmetic, no result is written yet
BOUNDARY = "="
#: two steps and an answer line take 30-50 tokens on SmolLM2; room for a longer working
MAX_NEW_TOKENS = 64
#: the number after the last "answer" (within a few characters), else the generation's last integer
ANSWER_REGEX = r"(?s)(?:.*[Aa]nswer\D{0,12}?|.*?(?=-?\d+\D*$))(-?\d+)"
#: what every prompt asks for after its problem
ASK = " Show each step as a calculation with =, then write the final line as 'Answer: <number>'."

_NAMES = ("Tom", "Ana", "Lee", "Mia", "Sam", "Zoe", "Raj", "Eva")
_THINGS = ("apples", "books", "coins", "stamps", "marbles", "pens", "cards", "shells")


def _add3(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(10, 99), rng.randint(10, 99), rng.randint(10, 99)
    return f"Compute {a} + {b} + {c}.", a + b + c


def _add_sub(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    c = rng.randint(5, a + b - 1)
    return f"Compute {a} + {b} - {c}.", a + b - c


def _mul_add(rng: random.Random) -> tuple[str, int]:
    a, b, c = rng.randint(3, 12), rng.randint(3, 12), rng.randint(10, 99)
    return f"Compute {a} * {b} + {c}.", a * b + c


def _story(rng: random.Random) -> tuple[str, int]:
    who, what = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b = rng.randint(10, 60), rng.randint(10, 60)
    c = rng.randint(2, a + b - 1)
    text = f"{who} has {a} {what}, gets {b} more, then gives away {c}. How many {what} does {who} have now?"
    return text, a + b - c


#: kinds in the order they take turns, so that any head of the set mixes all of them
KINDS: tuple[tuple[str, Callable[[random.Random], tuple[str, int]]], ...] = (
    ("add3", _add3), ("addsub", _add_sub), ("muladd", _mul_add), ("story", _story),
)


def generate(count: int) -> tuple[Item, ...]:
    """The first ``count`` items of one fixed stream (a longer set starts with every shorter one); a problem
    drawn twice is drawn again from the same stream, so the set holds no duplicate prompt."""
    rng = random.Random(2)
    seen: set[str] = set()
    items: list[Item] = []
    while len(items) < count:
        i = len(items)
        kind, draw = KINDS[i % len(KINDS)]
        problem, answer = draw(rng)
        if problem in seen:
            continue
        seen.add(problem)
        items.append(Item(id=f"arith2-{i:04d}-{kind}", answer=str(answer), prompt=problem + ASK))
    return tuple(items)
