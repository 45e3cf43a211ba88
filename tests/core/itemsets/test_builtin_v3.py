"""``builtin:arith-v3``, the built-in set for chat checkpoints: pinned bytes, 200 items, a boundary before any
result, and a label read at the model's *first* answer (a small model goes on inventing questions)."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_kvaudit.core.itemsets import arith_v2 as v2
from pytest_kvaudit.core.itemsets import arith_v3 as v3
from pytest_kvaudit.core.itemsets.builtin_items import BUILTIN_CHAT_DEFAULT, BUILTIN_DEFAULT, builtin_item_set
from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule
from pytest_kvaudit.core.model.items import extract_answer
from pytest_kvaudit.core.runtime.itemcheck import item_set_name, resolve

#: sha256 of v3's 200 (id, prompt, answer) triples: a change is a new set name (arith-v4), never a new digest
GOLDEN_SHA256 = "7bd1431d5e4d52be86c78141511c1a9c50afa202573d6d763b47a71cab399404"


def digest(rows: list[list[str | None]]) -> str:
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def test_200_pinned_items_the_same_in_a_fresh_interpreter() -> None:
    s = builtin_item_set(None, v3.NAME)
    assert str(s.path) == "<builtin:arith-v3>" and len(s.items) == v3.SIZE == 200
    assert len({i.prompt for i in s.items}) == len({i.id for i in s.items}) == 200
    assert digest([[i.id, i.prompt, i.answer] for i in s.items]) == GOLDEN_SHA256
    assert builtin_item_set(8, v3.NAME).items == s.items[:8]  # a shorter set is the head of a longer one
    code = ("import sys, json, hashlib\nfrom pytest_kvaudit.core.itemsets.builtin_items import builtin_item_set\n"
            "rows = [[i.id, i.prompt, i.answer] for i in builtin_item_set(None, 'builtin:arith-v3').items]\n"
            "print(hashlib.sha256(json.dumps(rows).encode()).hexdigest())\n"
            "print(sorted(m for m in ('torch', 'transformers', 'pytest') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "7", "PATH": ""}).stdout.split("\n")
    assert out[:2] == [GOLDEN_SHA256, "[]"]


def test_kinds_alternate_and_no_answer_can_be_copied_from_the_example() -> None:
    """A model that copies its example's answer (7 for step1, 5 for step2) never scores on that."""
    s = builtin_item_set(None, v3.NAME)
    kinds = [i.id.rsplit("-", 1)[1] for i in s.items]
    assert kinds == ["step1", "step2"] * 100
    for it, kind in zip(s.items, kinds):
        assert it.prompt and it.prompt.isascii() and it.prompt.endswith("\nAnswer:") and re.fullmatch(r"\d+", it.answer)
        assert it.answer != {"step1": "7", "step2": "5"}[kind]
        numbers = [int(x) for x in re.findall(r"\d+", it.prompt.rsplit("Question:", 1)[1])]
        assert all(2 <= x <= 9 for x in numbers[:2])
        assert int(it.answer) == (numbers[0] + numbers[1] - (numbers[2] if kind == "step2" else 0))


@pytest.mark.parametrize("text,want", [
    ("Mia has 3 apples and buys 8 more, so 3 + 8 = 11. The answer is 11.", "11"),
    # the model answers, then invents a question and answers that: the first answer is the label
    ("Tom has 2 cards and buys 5 more, so 2 + 5 = 7. The answer is 7.\n\nQuestion: Ben has 20 cards. He gives "
     "away 4. How many?\nAnswer: Ben has 20 cards, so 20 - 4 = 16. The answer is 16.", "7"),
    # it starts a question of its own before answering this one: no answer, not the invented one's
    ("Lee has 8 shells, so 8 + 2 = 10.\n\nQuestion: Ben has 3 shells. How many?\nAnswer: The answer is 3.", None),
    ("Raj has 9 pens, so 9 + 9 = 18. The answer is: 18.", "18"),
    ("Answer: 12\nThe answer is 13.", "12"),
    ("The answer to this is 40 + 2 = 42.", None),  # "answer to": not an answer phrase
    ("To solve this problem, we need to consider the total number of coins", None),
])
def test_the_label_is_read_at_the_first_answer(text: str, want: str | None) -> None:
    assert extract_answer(text, v3.ANSWER_REGEX) == want


def test_older_sets_keep_their_extraction() -> None:
    """v2's ledgers stay valid: its rule is still the last "answer" (a first-answer rule would read 12 here)."""
    assert extract_answer("Answer: 12 ... no wait, the answer is 81 apples", v2.ANSWER_REGEX) == "81"
    assert builtin_item_set(None, v2.NAME).answer_regex == v2.ANSWER_REGEX


def test_the_boundary_leaves_every_result_in_the_suffix() -> None:
    """The prefix ends at the first ", so": the facts restated, no result written; two suffixes after the same
    prefix extract different answers, so a divergent suffix can change the label."""
    s = builtin_item_set(None, v3.NAME)
    rule = BoundaryRule.parse(s.boundary)
    prefix = " Mia has 3 apples and buys 8 more, so"
    assert rule.marker is not None and prefix.endswith(rule.marker) and "=" not in prefix
    assert extract_answer(prefix + " 3 + 8 = 11. The answer is 11.", s.answer_regex) == "11"
    assert extract_answer(prefix + " 3 + 8 = 12. The answer is 12.", s.answer_regex) == "12"
    # the examples in every prompt show the marker before the first "="
    assert all(it.prompt and it.prompt.index(", so") < it.prompt.index(" = ") for it in s.items)


def test_the_default_for_chat_checkpoints_only(tmp_path: Path) -> None:
    """A checkpoint without items gets v3 when its prompts go through a chat template, v2 otherwise."""
    plain, chat = tmp_path / "plain", tmp_path / "chat"
    plain.mkdir()
    chat.mkdir()
    (chat / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert (BUILTIN_DEFAULT, BUILTIN_CHAT_DEFAULT) == (v2.NAME, v3.NAME)
    for model, mode, want in ((plain, None, v2.NAME), (chat, None, v3.NAME), (chat, False, v2.NAME),
                              (plain, True, v3.NAME)):
        cfg, iset = resolve(AuditConfig(model=str(model), n=3, chat_template=mode))
        assert item_set_name(iset) == want and len(iset.items) == 3, (model, mode)
        assert cfg.chat_template is (want == v3.NAME)
