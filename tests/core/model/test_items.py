"""Item sets: every malformed input is one KvauditError line naming the file and line; boundaries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import BoundaryRule
from pytest_kvaudit.core.model.items import extract_answer, find_boundary, load_item_set, parse_lines


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "set.jsonl"
    p.write_text(text)
    return p


def test_good_set_with_meta(tmp_path: Path) -> None:
    p = write(tmp_path,
              '{"id": "a", "prompt": "S12:", "answer": 3}\n\n{"id": "b", "prompt_ids": [1, 2], "answer": "x"}\n')
    (tmp_path / "set.meta.json").write_text(json.dumps({"boundary": ";", "answer_regex": r"A(\d+)"}))
    s = load_item_set(p)
    assert [i.id for i in s.items] == ["a", "b"]
    assert s.items[0].answer == "3" and s.items[1].prompt_ids == (1, 2)
    assert s.boundary == ";" and s.answer_regex == r"A(\d+)"
    assert load_item_set(p, boundary="tokens:3").boundary == "tokens:3"


@pytest.mark.parametrize(
    "text,needle",
    [
        ('{"id": "a", "prompt": "x", "answer": 1}\n{"id": "b", "prompt": "x"\n', "set.jsonl:2: not valid JSON"),
        ('{"id": "a", "answer": 1}\n', "set.jsonl:1: item 'a' lacks 'prompt'"),
        ('{"prompt": "x", "answer": 1}\n', "set.jsonl:1: item lacks a string 'id'"),
        ('{"id": "a", "prompt": "x"}\n', "lacks an 'answer'"),
        ('[1, 2]\n', "must be a JSON object"),
        ('{"id": "a", "prompt": "x", "answer": 1}\n{"id": "a", "prompt": "y", "answer": 2}\n',
         "set.jsonl:2: duplicate item id 'a' (first on line 1)"),
        ('{"id": "a", "prompt_ids": [], "answer": 1}\n', "'prompt_ids' must be a non-empty list"),
        ("\n\n", "holds no items"),
    ],
)
def test_malformed_sets_name_file_and_line(tmp_path: Path, text: str, needle: str) -> None:
    with pytest.raises(KvauditError) as exc:
        load_item_set(write(tmp_path, text))
    assert needle in str(exc.value)
    assert "\n" not in str(exc.value)


def test_missing_file_and_n_too_large(tmp_path: Path) -> None:
    with pytest.raises(KvauditError, match="does not exist: pass --kvaudit-items"):
        load_item_set(tmp_path / "nope.jsonl")
    p = write(tmp_path, '{"id": "a", "prompt": "x", "answer": 1}\n')
    with pytest.raises(KvauditError, match=r"--kvaudit-n=5 but .* holds only 1 items"):
        load_item_set(p, n=5)


def test_bad_regex(tmp_path: Path) -> None:
    p = write(tmp_path, '{"id": "a", "prompt": "x", "answer": 1}\n')
    with pytest.raises(KvauditError, match="capturing group"):
        load_item_set(p, answer_regex="A")


def test_answer_extraction() -> None:
    assert extract_answer("3+4=7|A7", r"\|A(\d+)") == "7"
    assert extract_answer("no answer", r"\|A(\d+)") is None


def test_boundary_marker_and_tokens() -> None:
    vocab = {1: "ab", 2: ";", 3: "c", 4: "</th", 5: "ink>"}

    def dec(ids: list[int]) -> str:
        return "".join(vocab[i] for i in ids)

    assert find_boundary([1, 3], BoundaryRule.parse(";"), dec) is None
    assert find_boundary([1, 3, 2], BoundaryRule.parse(";"), dec) == 3
    assert find_boundary([1, 2, 3, 2], BoundaryRule.parse(";"), dec) == 2  # the first occurrence
    assert find_boundary([1, 4, 5, 3], BoundaryRule.parse("</think>"), dec) == 3  # marker spanning tokens
    assert find_boundary([1, 3], BoundaryRule.parse("tokens:3"), dec) is None
    assert find_boundary([1, 3, 3, 3], BoundaryRule.parse("tokens:3"), dec) == 3
    with pytest.raises(KvauditError):
        BoundaryRule.parse("tokens:0")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_fuzz_any_text_gives_items_or_our_error(text: str) -> None:
    try:
        parse_lines(text, Path("fuzz.jsonl"))
    except KvauditError as exc:
        assert "\n" not in str(exc)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda c: st.lists(c, max_size=4)
    | st.dictionaries(st.sampled_from(["id", "prompt", "prompt_ids", "answer", "boundary", "x"]), c, max_size=5),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(json_values, max_size=5))
def test_fuzz_json_lines_give_items_or_our_error(values: list[object]) -> None:
    text = "\n".join(json.dumps(v) for v in values)
    try:
        parse_lines(text, Path("fuzz.jsonl"))
    except KvauditError:
        pass
