"""``builtin:arith-v2``, the default built-in set: pinned bytes, selectable by name beside v1, and a boundary
that leaves the answer in the suffix, so that a divergent suffix can change a label."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.itemsets import arith_v2 as v2
from pytest_kvaudit.core.itemsets.builtin_items import BUILTIN_DEFAULT, BUILTIN_NAME, builtin_item_set, is_builtin
from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule
from pytest_kvaudit.core.model.items import extract_answer
from pytest_kvaudit.core.runtime.itemcheck import item_set_name, resolve

#: sha256 of v2's 200 (id, prompt, answer) triples: a change is a new set name (arith-v3), never a new digest
GOLDEN_SHA256 = "0e612da37e84005e0a5a1fc19bf43d66c739925e221623693b659e6fe59cca25"


def test_default_is_v2_with_200_pinned_items() -> None:
    s = builtin_item_set()
    assert BUILTIN_DEFAULT == v2.NAME == "builtin:arith-v2" and str(s.path) == "<builtin:arith-v2>"
    assert len(s.items) == 200 and len({i.prompt for i in s.items}) == 200
    rows = [[i.id, i.prompt, i.answer] for i in s.items]
    assert hashlib.sha256(json.dumps(rows).encode()).hexdigest() == GOLDEN_SHA256
    assert builtin_item_set(8).items == s.items[:8]
    assert {i.id.rsplit("-", 1)[1] for i in s.items[:4]} == {"add3", "addsub", "muladd", "story"}
    for it in s.items:
        assert it.prompt and it.prompt.isascii() and it.prompt.endswith(v2.ASK) and re.fullmatch(r"\d+", it.answer)


@pytest.mark.parametrize("text,want", [
    ("17 + 26 + 38 = 43 + 38 = 81\nAnswer: 81", "81"),
    ("17 + 26 + 38 = 81\n\nThe answer is: 81.", "81"),
    ("Answer: 12 ... no wait, the answer is 81 apples", "81"),  # the last "answer" counts
    ("17 + 26 + 38 = 43 + 38 = 81.", "81"),  # no "answer": the last integer
    ("I cannot compute this.", None),
])
def test_answer_regex(text: str, want: str | None) -> None:
    assert extract_answer(text, v2.ANSWER_REGEX) == want


def test_labels_can_move_after_the_boundary() -> None:
    """The boundary ends at the first '=' the model writes: the prefix holds the restated problem, never a
    result, so two suffixes after the same prefix extract different answers, one right and one wrong."""
    item = builtin_item_set(1).items[0]
    rule = BoundaryRule.parse(builtin_item_set().boundary)
    prefix = "17 + 21 + 20 ="
    assert rule.marker is not None and prefix.endswith(rule.marker) and not re.search(r"=\s*\d", prefix)
    right = extract_answer(prefix + " 58\n\nAnswer: 58", v2.ANSWER_REGEX)
    wrong = extract_answer(prefix + " 38 + 20 = 48\n\nAnswer: 48", v2.ANSWER_REGEX)
    assert item.answer == "58" and right == "58" and wrong == "48"


def test_selected_by_name(tmp_path: Path) -> None:
    """``--kvaudit-items=builtin:NAME`` picks a built-in set, also for a checkpoint with its own items; a
    partial's ``<builtin:NAME>`` path reads back; an unknown name is one line listing the sets."""
    (tmp_path / "items.jsonl").write_text('{"id": "a", "prompt": "x", "answer": "1"}\n')
    cfg, iset = resolve(AuditConfig(model=str(tmp_path), items=BUILTIN_NAME, n=3))
    assert item_set_name(iset) == BUILTIN_NAME and len(iset.items) == 3 and iset.boundary == "tokens:8"
    _, iset = resolve(AuditConfig(model=str(tmp_path), items="<builtin:arith-v2>"))
    assert item_set_name(iset) == "builtin:arith-v2" and len(iset.items) == 200
    assert is_builtin("builtin:arith-v1") and not is_builtin(str(tmp_path / "items.jsonl")) and not is_builtin(None)
    with pytest.raises(KvauditError,
                       match=r"no such built-in item set; built-in sets: builtin:arith-v1, builtin:arith-v2"):
        resolve(AuditConfig(model=str(tmp_path), items="builtin:arith-v9"))


def test_a_checkpoint_without_items_gets_v2(tmp_path: Path) -> None:
    _, iset = resolve(AuditConfig(model=str(tmp_path), n=5, max_new_tokens=7))
    assert item_set_name(iset) == "builtin:arith-v2" and len(iset.items) == 5 and iset.max_new_tokens == 7
