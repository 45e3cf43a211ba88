"""``builtin:arith-v3``: one-shot word problems that a small chat model answers about half the time.

v2's problems (three two-digit terms, products) are beyond SmolLM2-135M-Instruct: 0/40 correct, so a label
could never move. v3 keeps what such a model does get right and is still not trivial for it: word problems on
the numbers 2 to 9, each after one worked example of its own kind, alternating two kinds:

- ``step1``: ``has a, buys b more`` (one addition; SmolLM2 answers most of them);
- ``step2``: ``has a, buys b more, gives away c`` (an addition, then a subtraction; it misses most).

The example fixes the shape of the working: the model restates the facts, writes ``, so a + b = s``, and ends
``The answer is N.`` The boundary is the end of the first ``, so``: the facts are restated (the first stage of
working) and no result is written yet, so every number the label depends on lies in the suffix. The answer
is read at the model's *first* answer (:data:`ANSWER_REGEX`): after answering, a small model goes on
inventing new questions and answering them, and those answers are not the label. Figures on SmolLM2 (chat
template, greedy): ``benchmarks/items_smollm2.py``, results under ``benchmarks/results/items-v3/``.

Deterministic like v1 and v2: one ``random.Random(3)`` stream drawn in a fixed order, plain ASCII, no torch.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from pytest_kvaudit.core.model.items import Item

NAME = "builtin:arith-v3"
#: the paper's unit count: the FP32 bound at 2% needs 183 units at 0 disagreements (Clopper-Pearson)
SIZE = 200
#: after the restated facts, before any result: ``Mia has 3 apples and buys 8 more, so``
BOUNDARY = ", so"
#: a two-step working ends its first answer within 56 tokens on SmolLM2 on nearly every item (the script's
#: figures); every token more is paid by every construction of every item
MAX_NEW_TOKENS = 56
#: the number after the first "answer is" / "Answer:", and only before the model starts a question of its own
ANSWER_REGEX = r"(?s)\A(?:(?!Question:).)*?[Aa]nswer(?:\s+is|:)\D{0,12}?(-?\d+)"
#: a suffix ends once its text holds the first answer, whole (a non-digit after its digits), or the model starts
#: a question of its own: what follows is never the label. The boundary precedes every answer (the script's
#: figures), so the label and the answer read from a stopped suffix are the ones the whole budget gives; the
#: tokens after them (a third of a trajectory on SmolLM2) are no longer decoded by any construction
STOP_REGEX = r"(?s)\A(?:(?!Question:).)*?(?:[Aa]nswer(?:\s+is|:)\D{0,12}?-?\d+\D|Question:)"

_NAMES = ("Tom", "Ana", "Lee", "Mia", "Sam", "Raj", "Eva", "Max")
_THINGS = ("apples", "books", "coins", "stamps", "marbles", "pens", "cards", "shells")
_EXAMPLE1 = ("Question: Ben has 3 cups. He buys 4 more cups. How many cups does Ben have now?\n"
             "Answer: Ben has 3 cups and buys 4 more, so 3 + 4 = 7. The answer is 7.\n\n")
_EXAMPLE2 = ("Question: Ben has 3 cups. He buys 4 more cups. Then he gives away 2 cups. How many cups does Ben have "
             "now?\nAnswer: Ben has 3 cups and buys 4 more, so 3 + 4 = 7. He gives away 2, so 7 - 2 = 5. "
             "The answer is 5.\n\n")


def _step1(rng: random.Random) -> tuple[str, int]:
    who, what = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    question = f"Question: {who} has {a} {what}. {who} buys {b} more {what}. How many {what} does {who} have now?"
    return _EXAMPLE1 + question + "\nAnswer:", a + b


def _step2(rng: random.Random) -> tuple[str, int]:
    who, what = rng.choice(_NAMES), rng.choice(_THINGS)
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    c = rng.randint(2, a + b - 1)
    question = (f"Question: {who} has {a} {what}. {who} buys {b} more {what}. Then {who} gives away {c} {what}. "
                f"How many {what} does {who} have now?")
    return _EXAMPLE2 + question + "\nAnswer:", a + b - c


#: kinds in the order they take turns, so that any head of the set mixes both, each with its example's answer
KINDS: tuple[tuple[str, Callable[[random.Random], tuple[str, int]], int], ...] = (
    ("step1", _step1, 7), ("step2", _step2, 5),
)


def generate(count: int) -> tuple[Item, ...]:
    """The first ``count`` items of one fixed stream (a longer set starts with every shorter one); a problem
    drawn twice is drawn again from the same stream, so the set holds no duplicate prompt; so is one whose answer
    is its example's, which a model copying the example would get right without computing anything."""
    rng = random.Random(3)
    seen: set[str] = set()
    items: list[Item] = []
    while len(items) < count:
        i = len(items)
        kind, draw, copied = KINDS[i % len(KINDS)]
        prompt, answer = draw(rng)
        if prompt in seen or answer == copied:
            continue
        seen.add(prompt)
        items.append(Item(id=f"arith3-{i:04d}-{kind}", answer=str(answer), prompt=prompt))
    return tuple(items)
