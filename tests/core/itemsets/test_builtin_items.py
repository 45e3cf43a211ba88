"""The built-in item set v1 (``builtin:arith-v1``): the same items on every machine, a boundary every model
reaches, plain ASCII. v2, the default, is pinned in test_builtin_v2.py."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.itemsets.builtin_items import (
    BUILTIN_MAX,
    BUILTIN_NAME,
    BUILTIN_PATH,
    BUILTIN_SIZE,
)
from pytest_kvaudit.core.itemsets.builtin_items import builtin_item_set as any_builtin_set
from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import ItemSet, extract_answer

#: sha256 of the default set's (id, prompt, answer) triples. A change here changes every ledger recorded on
#: the built-in set: bump BUILTIN_NAME's version with it, never just this digest.
GOLDEN_SHA256 = "0423935e1c24d8afc88bd1bb208d03a3c3506902f97c1f514f91510e59cabafc"


def builtin_item_set(n: int | None = None) -> ItemSet:
    """v1, selected by name as ``--kvaudit-items=builtin:arith-v1`` selects it."""
    return any_builtin_set(n, BUILTIN_NAME)


def digest(n: int | None = None) -> str:
    rows = [[i.id, i.prompt, i.answer] for i in builtin_item_set(n).items]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def test_deterministic_and_unique() -> None:
    a, b = builtin_item_set(), builtin_item_set()
    assert a == b
    assert len(a.items) == BUILTIN_SIZE == 64
    assert len({i.id for i in a.items}) == len(a.items)
    assert len({i.prompt for i in a.items}) == len(a.items)


def test_golden_digest() -> None:
    """Identical on every machine: pinned bytes, not only equal within one process."""
    assert digest() == GOLDEN_SHA256


def test_same_in_a_fresh_interpreter_without_torch_or_pytest() -> None:
    """Another process (another hash seed) builds the same set, and the import pulls in no torch or pytest."""
    code = (
        "import sys, json, hashlib\n"
        "from pytest_kvaudit.core.itemsets.builtin_items import builtin_item_set\n"
        "rows = [[i.id, i.prompt, i.answer] for i in builtin_item_set(None, 'builtin:arith-v1').items]\n"
        "print(hashlib.sha256(json.dumps(rows).encode()).hexdigest())\n"
        "print(sorted(m for m in ('torch', 'transformers', 'pytest') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}).stdout.split("\n")
    assert out[0] == digest()
    assert out[1] == "[]"


def test_n_takes_the_head() -> None:
    full = builtin_item_set()
    assert builtin_item_set(None) == full
    assert builtin_item_set(5).items == full.items[:5]
    assert builtin_item_set(1).items == full.items[:1]
    more = builtin_item_set(200)
    assert len(more.items) == 200 and more.items[:BUILTIN_SIZE] == full.items
    assert len(builtin_item_set(BUILTIN_MAX).items) == BUILTIN_MAX


@pytest.mark.parametrize("n,needle", [(0, "--kvaudit-n=0: must be at least 1"), (-3, "must be at least 1"),
                                      (BUILTIN_MAX + 1, "--kvaudit-items=FILE.jsonl")])
def test_bad_n_is_one_line(n: int, needle: str) -> None:
    with pytest.raises(KvauditError, match=re.escape(needle)) as err:
        builtin_item_set(n)
    assert "\n" not in str(err.value)


def test_boundary_is_a_token_offset() -> None:
    s = builtin_item_set()
    assert re.fullmatch(r"tokens:\d+", s.boundary)
    rule = BoundaryRule.parse(s.boundary)
    assert rule.marker is None and rule.tokens is not None and 1 <= rule.tokens < s.max_new_tokens
    assert all(i.boundary is None for i in s.items)  # no per-item override: one rule for the set


def test_prompts_are_plain_ascii_with_integer_answers() -> None:
    s = builtin_item_set(BUILTIN_MAX)
    for it in s.items:
        assert it.prompt and it.prompt_ids is None
        assert all(c == "\n" or 32 <= ord(c) < 127 for c in it.prompt), it
        assert it.prompt.endswith("\nA:")
        assert re.fullmatch(r"-?\d+", it.answer), it


def test_answer_regex_reads_the_first_integer() -> None:
    s = builtin_item_set()
    assert re.compile(s.answer_regex).groups == 1
    assert extract_answer(" 122\nQ: 3 + 4 = ?", s.answer_regex) == "122"
    assert extract_answer(" I do not know", s.answer_regex) is None


def test_named_for_reports() -> None:
    s = builtin_item_set()
    assert BUILTIN_NAME == "builtin:arith-v1"
    assert s.path == BUILTIN_PATH and str(s.path) == "<builtin:arith-v1>"
    assert not s.path.exists()
