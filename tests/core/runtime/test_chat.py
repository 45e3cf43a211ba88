"""Chat-template prompt ids: one tuple of ints on transformers 4.57 and 5.x, one-line errors otherwise.

Runs on both majors through ``scripts/matrix.sh`` (``TESTS=tests/core/runtime/test_chat.py bash scripts/matrix.sh``).
"""

from __future__ import annotations

import re
import shutil
from collections import UserDict
from pathlib import Path
from typing import Any

import pytest

from kvtest import REPO
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.runtime.chat import chat_prompt_ids
from pytest_kvaudit.testing import char_vocab, save_char_tokenizer, tiny_checkpoint


def by_hand(text: str) -> tuple[int, ...]:
    """What CHAR_CHAT_TEMPLATE renders for one user turn plus the generation prompt, one id per character."""
    v = char_vocab()
    return tuple(v[c] for c in text + ";" + "A:")


@pytest.fixture(scope="module")
def chat_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_checkpoint(tmp_path_factory.mktemp("chat"), "llama", layers=1, n_items=4, chat_template=True)


def load(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def test_expected_ids_from_the_saved_template(chat_ckpt: Path) -> None:
    tok = load(chat_ckpt)  # the template survives save_pretrained -> from_pretrained on this major
    assert tok.chat_template
    ids = chat_prompt_ids(tok, "S12:")
    assert ids == by_hand("S12:") == (17, 3, 4, 18, 14, 16, 18)
    assert type(ids) is tuple and all(type(i) is int for i in ids)
    # the template is really applied: plain tokenization gives the text alone
    assert ids != tuple(tok("S12:", add_special_tokens=True)["input_ids"])


def test_no_template_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    save_char_tokenizer(tmp_path)
    tok = load(tmp_path)
    assert not tok.chat_template
    with pytest.raises(KvauditError) as err:
        chat_prompt_ids(tok, "S12:", model="org/tiny")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("--kvaudit-chat-template: the tokenizer of org/tiny has no chat template: drop the flag")
    assert "chat_template to tokenizer_config.json" in msg
    # without a name, the tokenizer's own path names the model
    with pytest.raises(KvauditError, match=re.escape(f"the tokenizer of {tmp_path} has no chat template")):
        chat_prompt_ids(tok, "S12:")


def test_store_prompt_ids_uses_the_template(chat_ckpt: Path) -> None:
    """``--kvaudit-chat-template`` end to end through the Store (a traceback on transformers 5 before)."""
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig

    store = Store.open(AuditConfig(model=str(chat_ckpt), chat_template=True, dtypes=("fp32",), device="cpu"))
    item = store.items[0]
    assert item.prompt is not None
    assert store.prompt_ids(item, store.handle("fp32")) == by_hand(item.prompt)


class FakeTokenizer:
    """Returns a fixed object from apply_chat_template: every shape either major (or a custom class) gives."""

    name_or_path = "fake/model"
    chat_template = "{{ messages }}"

    def __init__(self, out: Any) -> None:
        self.out = out

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        assert conversation == [{"role": "user", "content": "hi"}]
        assert kwargs == {"add_generation_prompt": True, "tokenize": True}
        if isinstance(self.out, Exception):
            raise self.out
        return self.out


class BatchEncodingLike(UserDict):  # type: ignore[type-arg]
    """transformers' BatchEncoding is a UserDict, not a dict: the shape that broke on 5.x."""


def shapes() -> list[Any]:
    import numpy as np
    import torch

    ids = [5, 6, 7]
    return [
        ids,
        tuple(ids),
        [ids],
        {"input_ids": ids, "attention_mask": [1, 1, 1]},
        BatchEncodingLike({"input_ids": ids, "attention_mask": [1, 1, 1]}),
        BatchEncodingLike({"input_ids": [ids]}),
        torch.tensor(ids),
        torch.tensor([ids]),
        BatchEncodingLike({"input_ids": torch.tensor([ids])}),
        [torch.tensor(ids)],
        np.array(ids),
        [np.int64(5), np.int64(6), np.int64(7)],
    ]


@pytest.mark.parametrize("index", range(12))
def test_every_output_shape_gives_one_tuple_of_ints(index: int) -> None:
    out = shapes()[index]
    ids = chat_prompt_ids(FakeTokenizer(out), "hi")
    assert ids == (5, 6, 7)
    assert all(type(i) is int for i in ids)


def test_real_batch_encoding_from_this_major(chat_ckpt: Path) -> None:
    """Whatever this transformers returns by default (list on 4.57, BatchEncoding on 5.x) is handled."""
    tok = load(chat_ckpt)
    raw = tok.apply_chat_template([{"role": "user", "content": "S1:"}], add_generation_prompt=True, tokenize=True)
    assert chat_prompt_ids(tok, "S1:") == by_hand("S1:")
    assert isinstance(raw, list) or "input_ids" in raw  # the two shapes the majors give


@pytest.mark.parametrize(
    "out,needle",
    [
        ([[1, 2], [3, 4]], "returned a batch of 2, expected one prompt"),
        ({"ids": [1]}, "returned no input_ids (keys: ['ids'])"),
        ("S12:;A:", "returned str, not token ids"),
        (["S", "1"], "returned list, not token ids"),
        ([1, -2], "returned list, not token ids"),
        ([True, False], "returned list, not token ids"),
        ([], "rendered an empty prompt"),
        (ValueError("Conversation roles must alternate\nuser/assistant"),
         "the chat template of fake/model failed: ValueError: Conversation roles must alternate user/assistant"),
    ],
)
def test_bad_outputs_are_one_line(out: Any, needle: str) -> None:
    with pytest.raises(KvauditError) as err:
        chat_prompt_ids(FakeTokenizer(out), "hi")
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("--kvaudit-chat-template: ")
    assert needle in str(err.value)


@pytest.mark.parametrize("template", [None, ""])
def test_empty_or_missing_template_attribute(template: str | None) -> None:
    tok = FakeTokenizer([1])
    tok.chat_template = template  # type: ignore[assignment]
    with pytest.raises(KvauditError, match="the tokenizer of fake/model has no chat template"):
        chat_prompt_ids(tok, "hi")


def test_a_chat_template_checkpoint_runs_the_suite(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """--kvaudit-chat-template end to end: the plugin runs a claim on a checkpoint that carries a template."""
    ckpt = tiny_checkpoint(tmp_path / "chat", "llama", n_items=4, chat_template=True)
    shutil.copy(REPO / "suites" / "test_replica_exactness.py", pytester.path)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    replica_exactness.min_units=4\n")
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ckpt}", "--kvaudit-chat-template", f"--kvaudit-report={rep}",
                                        "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.no_fnmatch_line("*Traceback*")
