"""Item sets (JSONL), their per-set settings, boundary rules and answer extraction.

An item set is ``NAME.jsonl`` with one JSON object a line (``id``, ``prompt`` or ``prompt_ids``,
``answer``, optional ``boundary``), and optionally ``NAME.meta.json`` beside it with the set's
defaults (``boundary``, ``answer_regex``, ``max_new_tokens``, ``stop_regex``), so that an item set carries the
rules it was written for.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import BoundaryRule

DEFAULT_ANSWER_REGEX = r"(?:answer is|Answer:|\\boxed\{)\s*([^\s}]+)"
DEFAULT_BOUNDARY = "</think>"
DEFAULT_MAX_NEW_TOKENS = 256


@dataclass(frozen=True)
class Item:
    id: str
    answer: str
    prompt: str | None = None
    prompt_ids: tuple[int, ...] | None = None
    boundary: str | None = None
    #: where the item was read ("file:line"), for errors found once the model is known
    where: str = field(default="", compare=False)


@dataclass(frozen=True)
class ItemSet:
    path: Path
    items: tuple[Item, ...]
    boundary: str
    answer_regex: str
    max_new_tokens: int
    #: where a suffix ends before its budget (like a stop string): decoding after the boundary stops at the first
    #: token after which the suffix's text matches this regex; None decodes to the budget or EOS (:func:`stopper`)
    stop_regex: str | None = None
    #: the report's ``items.chat_template`` block as the run resolved it
    #: (:func:`pytest_kvaudit.core.runtime.chat.report_block`); a merge reads it from the shards' partials, since its
    #: own options may not say what the shards asked
    chat: dict[str, Any] = field(default_factory=dict, compare=False)


def _where(path: Path, lineno: int) -> str:
    return f"{path}:{lineno}"


def parse_item(obj: Any, path: Path, lineno: int) -> Item:
    """One JSON value -> Item, or a KvauditError naming the file and line."""
    at = _where(path, lineno)
    if not isinstance(obj, dict):
        raise KvauditError(f"{at}: an item must be a JSON object with id, prompt and answer, got {type(obj).__name__}")
    if "id" not in obj or not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
        raise KvauditError(f"{at}: item lacks a string 'id'")
    iid = str(obj["id"])
    if "answer" not in obj or not isinstance(obj["answer"], (str, int, float)) or isinstance(obj["answer"], bool):
        raise KvauditError(f"{at}: item {iid!r} lacks an 'answer' (string or number)")
    prompt = obj.get("prompt")
    prompt_ids = obj.get("prompt_ids")
    if prompt is None and prompt_ids is None:
        raise KvauditError(f"{at}: item {iid!r} lacks 'prompt' (text) or 'prompt_ids' (list of token ids)")
    if prompt is not None and not isinstance(prompt, str):
        raise KvauditError(f"{at}: item {iid!r}: 'prompt' must be a string")
    ids: tuple[int, ...] | None = None
    if prompt_ids is not None:
        if (
            not isinstance(prompt_ids, list)
            or not prompt_ids
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt_ids)
        ):
            raise KvauditError(f"{at}: item {iid!r}: 'prompt_ids' must be a non-empty list of non-negative ints")
        ids = tuple(prompt_ids)
    if prompt is not None and prompt == "":
        raise KvauditError(f"{at}: item {iid!r}: 'prompt' is empty")
    boundary = obj.get("boundary")
    if boundary is not None:
        if not isinstance(boundary, str):
            raise KvauditError(f"{at}: item {iid!r}: 'boundary' must be a marker string or 'tokens:K'")
        try:
            BoundaryRule.parse(boundary)
        except KvauditError as exc:
            raise KvauditError(f"{at}: item {iid!r}: {exc}") from None
    return Item(id=iid, answer=str(obj["answer"]), prompt=prompt, prompt_ids=ids, boundary=boundary, where=at)


def parse_lines(text: str, path: Path) -> list[Item]:
    items: list[Item] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise KvauditError(f"{_where(path, lineno)}: not valid JSON ({exc.msg}); each line must be one item "
                               "object") from None
        item = parse_item(obj, path, lineno)
        if item.id in seen:
            raise KvauditError(f"{_where(path, lineno)}: duplicate item id {item.id!r} (first on line {seen[item.id]})")
        seen[item.id] = lineno
        items.append(item)
    return items


def load_meta(path: Path) -> dict[str, Any]:
    meta_path = path.with_name(path.name.removesuffix(".jsonl") + ".meta.json")
    if not meta_path.is_file():
        return {}
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise KvauditError(f"{meta_path}: not valid JSON ({exc}); fix or delete the item set's settings file") from None
    if not isinstance(meta, dict):
        raise KvauditError(f"{meta_path}: must hold a JSON object of item-set settings")
    for key, (ok, want) in META_FIELDS.items():
        if key in meta and meta[key] is not None and not ok(meta[key]):
            raise KvauditError(f"{meta_path}: field {key!r} must be {want}, got {json.dumps(meta[key])[:60]}")
    for key in ("boundary", "answer_regex", "stop_regex"):
        if meta.get(key) == "":
            raise KvauditError(f"{meta_path}: field {key!r} is empty: give a value or delete the field")
    if meta.get("boundary"):
        try:
            BoundaryRule.parse(meta["boundary"])
        except KvauditError as exc:
            raise KvauditError(f"{meta_path}: field 'boundary': {exc}") from None
    return meta


def _positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


#: the settings an item set's ``.meta.json`` may hold: field -> (check, what it must be)
META_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "boundary": (lambda v: isinstance(v, str), "a marker string or 'tokens:K'"),
    "answer_regex": (lambda v: isinstance(v, str), "a regex string with one capturing group"),
    "max_new_tokens": (_positive_int, "a whole number >= 1"),
    "stop_regex": (lambda v: isinstance(v, str), "a regex string (where a suffix ends before its budget)"),
}


def load_item_set(
    path: Path,
    n: int | None = None,
    boundary: str | None = None,
    answer_regex: str | None = None,
    max_new_tokens: int | None = None,
    stop_regex: str | None = None,
) -> ItemSet:
    """Read an item set; explicit arguments override the set's ``.meta.json``, which overrides defaults."""
    if not path.is_file():
        raise KvauditError(f"item file {path} does not exist: pass --kvaudit-items=FILE.jsonl")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise KvauditError(f"item file {path} is not UTF-8 text: item sets are JSONL") from None
    items = parse_lines(text, path)
    if not items:
        raise KvauditError(f"item file {path} holds no items: add JSONL lines with id, prompt and answer")
    if n is not None:
        if n < 1:
            raise KvauditError(f"--kvaudit-n={n}: must be at least 1")
        if n > len(items):
            raise KvauditError(f"--kvaudit-n={n} but {path} holds only {len(items)} items: lower --kvaudit-n")
        items = items[:n]
    meta = load_meta(path)
    regex = answer_regex or meta.get("answer_regex") or DEFAULT_ANSWER_REGEX
    try:
        compiled = re.compile(regex)
    except re.error as exc:
        raise KvauditError(f"answer regex {regex!r} does not compile ({exc})") from None
    if compiled.groups < 1:
        raise KvauditError(f"answer regex {regex!r} needs one capturing group around the answer")
    b = boundary or meta.get("boundary") or DEFAULT_BOUNDARY
    BoundaryRule.parse(b)
    mnt = int(max_new_tokens if max_new_tokens is not None else meta.get("max_new_tokens") or DEFAULT_MAX_NEW_TOKENS)
    if mnt < 1:
        raise KvauditError(f"--kvaudit-max-new-tokens={mnt}: must be at least 1")
    stop = check_stop_regex(stop_regex if stop_regex is not None else meta.get("stop_regex"))
    return ItemSet(path=path, items=tuple(items), boundary=b, answer_regex=regex, max_new_tokens=mnt, stop_regex=stop)


#: ``--kvaudit-stop-regex=off``: decode every suffix to its budget or EOS, whatever the item set says
STOP_OFF = "off"


def check_stop_regex(regex: str | None) -> str | None:
    """The stop regex as the run uses it: None for none or ``off``; one that does not compile is named."""
    if regex is None or regex == STOP_OFF:
        return None
    if not regex:
        raise KvauditError("stop regex is empty: give a regex, or 'off' to decode every suffix to its budget")
    try:
        re.compile(regex)
    except re.error as exc:
        raise KvauditError(f"stop regex {regex!r} does not compile ({exc}): fix --kvaudit-stop-regex or the item "
                           "set's stop_regex") from None
    return regex


def stopper(item_set: ItemSet, decode: Callable[[Sequence[int]], str]) -> Callable[[Sequence[int]], bool] | None:
    """The item set's stop rule over a suffix's ids (None when it has none): true once the suffix's text
    matches ``stop_regex``. Every construction of a unit continues from the same prefix under the same rule,
    so their suffixes stay comparable token for token; a suffix that departs stops where its own text says."""
    if item_set.stop_regex is None:
        return None
    rx = re.compile(item_set.stop_regex)
    return lambda ids: rx.search(decode(ids)) is not None


def token_text(tokenizer: Any, ids: Sequence[int]) -> str:
    """Token ids as the model wrote them (special tokens kept): what boundaries, answers and stop rules read."""
    return str(tokenizer.decode(list(ids), skip_special_tokens=False))


def extract_answer(text: str, regex: str) -> str | None:
    """The first match's group, stripped; None when the text holds no answer."""
    m = re.search(regex, text)
    return m.group(1).strip() if m else None


def find_boundary(
    generated: Sequence[int], rule: BoundaryRule, decode: Callable[[Sequence[int]], str]
) -> int | None:
    """Number of generated tokens in the prefix, or None while the boundary is not reached.

    For a marker, the prefix ends with the token that completes the marker's first occurrence in the
    decoded generation; the ids themselves are never re-encoded.
    """
    if rule.tokens is not None:
        return rule.tokens if len(generated) >= rule.tokens else None
    assert rule.marker is not None
    text = decode(generated)
    at = text.find(rule.marker)
    if at < 0:
        return None
    end = at + len(rule.marker)
    # the shortest head of the generation whose text covers the marker's end
    lo, hi = 1, len(generated)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(generated[:mid])) >= end and decode(generated[:mid]).find(rule.marker) >= 0:
            hi = mid
        else:
            lo = mid + 1
    return lo
