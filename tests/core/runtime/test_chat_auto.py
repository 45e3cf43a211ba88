"""``--kvaudit-chat-template=auto|on|off``: the template by default where the checkpoint ships one and the items
are text, said in the header and the report, off on request, and named as the likely cause when items never
reach their boundary with it off."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtest import REPO
from pytest_kvaudit.claims.notes import ineligible_note
from pytest_kvaudit.core.compute.cells import prompt_ids
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.items import Item
from pytest_kvaudit.core.model.records import CellRecord
from pytest_kvaudit.core.runtime.chat import (
    applies,
    header_line,
    missed_template_hint,
    parse_mode,
    report_block,
    template_source,
)
from pytest_kvaudit.core.runtime.itemcheck import resolve
from pytest_kvaudit.report.terminal import lines
from pytest_kvaudit.testing import CHAR_CHAT_TEMPLATE, save_char_tokenizer, tiny_checkpoint, write_items

TEXT = Item(id="a", answer="1", prompt="S12:")
IDS = Item(id="b", answer="1", prompt_ids=(3, 4))


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Folders with a char tokenizer: one with a template in tokenizer_config.json, one without any."""
    out = {}
    for name, chat in (("chat", True), ("plain", False)):
        out[name] = tmp_path_factory.mktemp(name)
        save_char_tokenizer(out[name], chat)
    return out


def load(path: Path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


@pytest.mark.parametrize("text,want", [("auto", None), ("on", True), ("OFF", False), ("true", True), ("0", False)])
def test_modes(text: str, want: bool | None) -> None:
    assert parse_mode(text) is want


def test_a_bad_mode_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(KvauditError, match=r"^--kvaudit-chat-template='maybe': use auto .*, on or off$"):
        parse_mode("maybe")
    # the bare flag followed by a test path took the path as its value: say so
    with pytest.raises(KvauditError, match=r"write --kvaudit-chat-template=on before test paths"):
        parse_mode(str(tmp_path))


def test_the_source_is_read_from_the_files_transformers_reads(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    assert template_source(tokenizers["chat"]) in ("chat_template.jinja", "tokenizer_config.json")
    assert template_source(tokenizers["plain"]) is None
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAR_CHAT_TEMPLATE}))
    assert template_source(tmp_path) == "tokenizer_config.json"
    (tmp_path / "chat_template.jinja").write_text(CHAR_CHAT_TEMPLATE)
    assert template_source(tmp_path) == "chat_template.jinja"
    (tmp_path / "chat_template.jinja").unlink()
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    assert template_source(tmp_path) is None  # the tokenizer's own load reports a broken config


def test_a_gguf_names_its_metadata_key(smollm2: tuple[Path, Path]) -> None:
    gguf_file, checkpoint = smollm2
    assert template_source(gguf_file) == f"{gguf_file.name} (tokenizer.chat_template)"
    assert template_source(checkpoint) is not None


def test_auto_on_off_on_a_tokenizer_with_and_without_a_template(tokenizers: dict[str, Path]) -> None:
    chat, plain = load(tokenizers["chat"]), load(tokenizers["plain"])
    wrapped = prompt_ids(TEXT, chat, True)
    bare = prompt_ids(TEXT, chat, False)
    assert wrapped != bare and len(wrapped) == len(bare) + 3  # ";A:" after the prompt
    assert prompt_ids(TEXT, chat, None) == wrapped  # auto, unresolved: the tokenizer has one
    assert prompt_ids(TEXT, plain, None) == prompt_ids(TEXT, plain, False)  # auto without one: plain text
    with pytest.raises(KvauditError, match="has no chat template"):
        prompt_ids(TEXT, plain, True)  # on demands one
    assert prompt_ids(IDS, chat, True) == (3, 4)  # given ids are never wrapped


def test_resolve_decides_auto(tokenizers: dict[str, Path], tmp_path: Path) -> None:
    """auto -> on where a template ships and some item is text; off where none ships or every item is ids;
    on and off stay as asked."""
    for name in ("chat", "plain"):
        write_items(tokenizers[name], n=2)
    assert resolve(AuditConfig(model=str(tokenizers["chat"])))[0].chat_template is True
    assert resolve(AuditConfig(model=str(tokenizers["plain"])))[0].chat_template is False
    assert resolve(AuditConfig(model=str(tokenizers["chat"]), chat_template=False))[0].chat_template is False
    assert resolve(AuditConfig(model=str(tokenizers["plain"]), chat_template=True))[0].chat_template is True
    ids = tmp_path / "ids.jsonl"
    ids.write_text('{"id": "x", "prompt_ids": [3, 4], "answer": "1"}\n')
    assert resolve(AuditConfig(model=str(tokenizers["chat"]), items=str(ids)))[0].chat_template is False
    assert applies(None, "t.jinja", [TEXT, IDS]) and not applies(None, None, [TEXT]) and applies(True, None, [IDS])


def test_header_says_the_source_and_how_to_turn_it_off() -> None:
    assert header_line(None, "chat_template.jinja") == (
        "chat template: on for text prompts (auto: the checkpoint ships one in chat_template.jinja); "
        "--kvaudit-chat-template=off sends them as plain text")
    assert "none shipped" in header_line(None, None)
    assert "off turns it off" in header_line(True, "x.json")
    assert header_line(False, "x.json") == ("chat template: off (--kvaudit-chat-template=off), though the checkpoint "
                                            "ships one in x.json")


def test_the_report_carries_it_only_where_there_is_something_to_say() -> None:
    assert report_block(None, False, None) == {}  # the embedded checkpoint's report stays as it was
    assert report_block(None, True, "t.jinja") == {
        "chat_template": {"mode": "auto", "applied": True, "source": "t.jinja"}}
    assert report_block(False, False, "t.jinja")["chat_template"]["applied"] is False


def _unreached(n: int) -> list[CellRecord]:
    return [CellRecord(f"i{j}", "fp32", (1,), (2,) * 6, None, "boundary_not_reached", "1") for j in range(n)]


def test_the_hint_names_the_template_only_when_it_was_off_and_ships(tokenizers: dict[str, Path]) -> None:
    off = AuditConfig(model=str(tokenizers["chat"]), chat_template=False)
    note = ineligible_note(_unreached(3), off)
    assert note.startswith(" (ineligible: boundary_not_reached 3; the chat template (")
    assert "--kvaudit-chat-template=auto or on is the likely fix" in note and note.endswith(")")
    for cfg in (off.replace(chat_template=None), off.replace(chat_template=True),
                AuditConfig(model=str(tokenizers["plain"]), chat_template=False)):
        assert ineligible_note(_unreached(3), cfg) == " (ineligible: boundary_not_reached 3)"
    assert missed_template_hint(None, "t.jinja") == "" and missed_template_hint(False, None) == ""


def test_the_terminal_items_line_names_it() -> None:
    rep = {"model": {"id": "m", "weights_digest": ""}, "claims": {},
           "items": {"total": 8, "eligible": 0, "ineligible": {"boundary_not_reached": 8}}}
    assert lines(rep)[1] == "items 0/8 eligible (ineligible: boundary_not_reached 8)"
    rep["items"]["chat_template"] = {"mode": "off", "applied": False, "source": "t.gguf (tokenizer.chat_template)"}
    assert lines(rep)[1].startswith("items 0/8 eligible (ineligible: boundary_not_reached 8); the chat template "
                                    "(t.gguf (tokenizer.chat_template)) was off")
    rep["items"]["chat_template"]["applied"] = True
    assert lines(rep)[1] == "items 0/8 eligible (ineligible: boundary_not_reached 8)"


def test_end_to_end_auto_by_default_and_the_hint_when_off(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A checkpoint that ships a template: applied with no flag (header and report say so); with it off and a
    boundary no trajectory can reach, the items line and the inconclusive reason name the template."""
    ckpt = tiny_checkpoint(tmp_path / "chat", "llama", layers=1, n_items=4, chat_template=True)
    shutil.copy(REPO / "suites" / "test_replica_exactness.py", pytester.path)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    replica_exactness.min_units=4\n")
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ckpt}", f"--kvaudit-report={rep}", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["kvaudit: chat template: on for text prompts (auto: the checkpoint ships one in *); "
                              "--kvaudit-chat-template=off sends them as plain text"])
    assert json.loads(rep.read_text())["items"]["chat_template"]["applied"] is True
    # eight A's in six new tokens: never reached
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ckpt}", "--kvaudit-chat-template=off",
                                        "--kvaudit-boundary=AAAAAAAA",
                                        "--kvaudit-max-new-tokens=6", f"--kvaudit-report={rep}", "-p",
                                        "no:cacheprovider")
    res.stdout.fnmatch_lines(["*chat template: off (--kvaudit-chat-template=off), though the checkpoint ships one in *",
                              "items 0/4 eligible (ineligible: boundary_not_reached 4); "
                              "the chat template (*) was off*"])
    reason = json.loads(rep.read_text())["claims"]["replica_exactness"]["reason"]
    assert "--kvaudit-chat-template=auto or on is the likely fix" in reason


class _Config:
    """The options and ini values build_config reads (pytest's own parsing is covered end to end above)."""

    def __init__(self, option: str | None, ini: str = "") -> None:
        self.option, self.ini = option, ini
        self.rootpath = Path("/nonexistent-root")

    def getoption(self, name: str) -> object:
        return self.option if name == "kvaudit_chat_template" else None

    def getini(self, name: str) -> object:
        return self.ini if name == "kvaudit_chat_template" else ""


@pytest.mark.parametrize("option,ini,want", [(None, "", None), ("on", "", True), (None, "off", False),
                                             (None, "true", True), ("auto", "off", None)])
def test_the_flag_and_its_ini_twin(option: str | None, ini: str, want: bool | None) -> None:
    """auto by default; the flag wins over the ini key; an old ini boolean still reads."""
    from pytest_kvaudit import option_values as ov

    assert ov.build_config(_Config(option, ini)).chat_template is want  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match=r"--kvaudit-chat-template is empty"):
        ov.build_config(_Config(""))  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match=r"kvaudit_chat_template \(ini\)='sometimes': use auto"):
        ov.build_config(_Config(None, "sometimes"))  # type: ignore[arg-type]
