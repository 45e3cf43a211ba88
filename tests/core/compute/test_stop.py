"""The item set's stop rule (``stop_regex``, ``--kvaudit-stop-regex``): every construction's suffix ends where
its own text first matches, the label it reads is the one the whole budget gives (for ``builtin:arith-v3``),
and a run with a stop rule is another run for the ledger and the gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.itemsets import arith_v3 as v3
from pytest_kvaudit.core.itemsets.builtin_items import builtin_item_set
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.items import check_stop_regex, extract_answer, load_item_set, stopper

STOP = r"=\d+;"  # on the embedded checkpoint: the suffix ends after its first written sum


def test_the_v3_set_declares_its_stop_and_others_none() -> None:
    assert builtin_item_set(4, v3.NAME).stop_regex == v3.STOP_REGEX
    assert builtin_item_set(4, "builtin:arith-v2").stop_regex is None


def test_bad_stop_regexes_are_one_line_naming_the_fix(tmp_path: Path) -> None:
    assert check_stop_regex("off") is None and check_stop_regex(None) is None
    for bad, words in (("", "is empty"), ("(", "does not compile")):
        with pytest.raises(KvauditError) as err:
            check_stop_regex(bad)
        assert words in str(err.value) and "\n" not in str(err.value)
    items = tmp_path / "set.jsonl"
    items.write_text('{"id": "a", "prompt": "x", "answer": "1"}\n')
    (tmp_path / "set.meta.json").write_text(json.dumps({"stop_regex": 3}))
    with pytest.raises(KvauditError, match="field 'stop_regex' must be a regex string"):
        load_item_set(items)
    (tmp_path / "set.meta.json").write_text(json.dumps({"stop_regex": "A\\d"}))
    assert load_item_set(items).stop_regex == "A\\d"
    assert load_item_set(items, stop_regex="off").stop_regex is None  # the option turns the set's off


def _pieces() -> st.SearchStrategy[str]:
    number = st.integers(0, 120).map(str)
    piece = st.one_of(st.sampled_from([" Mia has 3 apples and buys 8 more, so", " 3 + 8 = 11.", " The answer is ",
                                       "Answer: ",
                                       "\n\nQuestion: Tom has 2 pens.", " answer is: ", ".", " ", "\n", "-"]), number)
    return st.lists(piece, max_size=14).map("".join)


@given(_pieces())
def test_a_v3_suffix_stopped_reads_the_label_the_whole_budget_gives(text: str) -> None:
    """Character by character (the finest tokenization), the text cut where the stop rule first matches holds
    the same first answer as the whole text: no token that the label depends on is ever cut away."""
    stop = stopper(builtin_item_set(1, v3.NAME), lambda ids: "".join(map(chr, ids)))
    assert stop is not None
    ids = [ord(c) for c in text]
    k = next((k for k in range(1, len(ids) + 1) if stop(ids[:k])), len(ids))
    assert extract_answer(text[:k], v3.ANSWER_REGEX) == extract_answer(text, v3.ANSWER_REGEX)


def test_a_stop_that_cuts_digits_would_move_labels() -> None:
    """The property above can fail: a rule that stops at the answer's first digit cuts ``12`` to ``1``."""
    text = " so 5 + 7 = 12. The answer is 12."
    cut = next(k for k in range(1, len(text) + 1) if __import__("re").search(r"answer is \d", text[:k]))
    assert extract_answer(text[:cut], v3.ANSWER_REGEX) != extract_answer(text, v3.ANSWER_REGEX)


@pytest.fixture(scope="module")
def runs() -> tuple[object, object]:
    from pytest_kvaudit.core.compute.store import Store

    out = []
    for stop in (None, STOP):
        s = Store.open(AuditConfig(n=3, dtypes=("fp32",), stop_regex=stop, work=("constructions", "replicas", "fixed")))
        s.compute()
        out.append(s)
    return out[0], out[1]


@pytest.mark.slow  # the module's runs load a model
def test_every_construction_stops_at_its_own_first_match(runs: tuple[object, object]) -> None:
    import re

    whole, stopped = runs
    tok = stopped.handle("fp32").tokenizer  # type: ignore[attr-defined]
    seen = 0
    for key, rec in stopped.records.items():  # type: ignore[attr-defined]
        full = whole.records[key]  # type: ignore[attr-defined]
        assert rec.eligible and full.eligible
        assert rec.generated == full.generated[: len(rec.generated)] and len(rec.generated) < len(full.generated)
        conts = {**rec.constructions, **{f"fixed:{k}": c for k, c in rec.fixed.items()}}
        others = {**full.constructions, **{f"fixed:{k}": c for k, c in full.fixed.items()}}
        assert {"live", "prefill", "incremental", "live:replica", "fixed:replay"} <= set(conts)
        for name, c in conts.items():
            text = tok.decode(list(c.suffix))
            assert re.search(STOP, text), (key, name, text)
            assert not re.search(STOP, tok.decode(list(c.suffix[:-1]))), (key, name, text)  # the first match
            assert others[name].suffix[: len(c.suffix)] == c.suffix  # the same decoding, cut short
            seen += 1
    assert seen >= 15
    assert stopped.cost.forward_tokens < whole.cost.forward_tokens  # type: ignore[attr-defined]


@pytest.mark.slow  # the module's runs load a model
def test_a_ledger_with_a_stop_is_another_runs(runs: tuple[object, object]) -> None:
    from pytest_kvaudit.core.cost import ledger as L

    whole, stopped = runs
    a, b = L.build(whole), L.build(stopped)  # type: ignore[arg-type]
    assert "stop_regex" not in a["config"]  # a set without one writes the ledger it always wrote
    assert b["config"]["stop_regex"] == STOP
    assert L.identity_differences(a, b, tokens_only=True) == [f"config.stop_regex recorded None, now {STOP!r}"]


def test_vllm_cuts_its_suffixes_by_the_same_rule() -> None:
    """vLLM decodes to the budget; its suffixes (and their logit rows) are cut where a stopped decoder stops."""
    from pytest_kvaudit.core.requests.arithmetic import stopped

    def stop(ids: object) -> bool:
        return 3 in ids  # type: ignore[operator]

    assert stopped(stop, (1, 2, 3, 4), ["a", "b", "c", "d"]) == ((1, 2, 3), ["a", "b", "c"])
    assert stopped(stop, (1, 2), ["a", "b"]) == ((1, 2), ["a", "b"])
    assert stopped(None, (3, 4), ["a", "b"]) == ((3, 4), ["a", "b"])
