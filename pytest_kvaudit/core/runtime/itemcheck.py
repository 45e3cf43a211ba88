"""A run's item set, resolved for its checkpoint and checked against the tokenizer before any cell runs: a
mistake here would make every item silently ineligible or index past the embedding."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.itemsets.builtin_items import (
    BUILTIN_CHAT_DEFAULT,
    BUILTIN_DEFAULT,
    builtin_item_set,
    is_builtin,
)
from pytest_kvaudit.core.model.config import EMBEDDED_DIR, EMBEDDED_NAME, AuditConfig, BoundaryRule
from pytest_kvaudit.core.model.items import Item, ItemSet, check_stop_regex, load_item_set, token_text
from pytest_kvaudit.core.runtime.chat import applies, report_block, template_source
from pytest_kvaudit.core.runtime.loading import resolve_checkpoint


def resolve(cfg: AuditConfig) -> tuple[AuditConfig, ItemSet]:
    """The config with its item file resolved (the checkpoint's own by default) and the chat template decided
    (auto: on when the checkpoint ships one and the items are text), and the item set. A chat checkpoint
    without items gets :data:`BUILTIN_CHAT_DEFAULT`, every other one :data:`BUILTIN_DEFAULT`."""
    local = resolve_checkpoint(cfg.model, cfg.trust_remote_code)  # a missing checkpoint is named first
    source = template_source(local)
    if not cfg.items and (local / "items.jsonl").is_file():
        cfg = cfg.replace(items=str(local / "items.jsonl"))
    if not cfg.items or is_builtin(cfg.items):  # no item set, or one named: a built-in set, named in the report
        chat = cfg.chat_template if cfg.chat_template is not None else source is not None
        iset = builtin_item_set(cfg.n, cfg.items or (BUILTIN_CHAT_DEFAULT if chat else BUILTIN_DEFAULT))
        over: dict[str, Any] = {k: v for k, v in (("boundary", cfg.boundary), ("answer_regex", cfg.answer_regex),
                                  ("max_new_tokens", cfg.max_new_tokens)) if v is not None}
        if cfg.stop_regex is not None:
            over["stop_regex"] = check_stop_regex(cfg.stop_regex)
        iset = dataclasses.replace(iset, **over)
    else:
        iset = load_item_set(cfg.items_path(), cfg.n, cfg.boundary, cfg.answer_regex, cfg.max_new_tokens,
                             cfg.stop_regex)
    applied = applies(cfg.chat_template, source, iset.items)
    iset = dataclasses.replace(iset, chat=report_block(cfg.chat_template, applied, source))
    return cfg.replace(chat_template=applied), iset


def check_markers(items: Iterable[Item], item_set: ItemSet, tokenizer: Any, model: str) -> None:
    """A boundary marker the tokenizer cannot even spell would make every item silently ineligible."""
    rules = {item.boundary or item_set.boundary for item in items}
    for text in sorted(rules):
        rule = BoundaryRule.parse(text)
        if rule.marker is None:
            continue
        ids = tokenizer(rule.marker, add_special_tokens=False)["input_ids"]
        back = token_text(tokenizer, ids)
        if rule.marker not in back:
            raise KvauditError(
                f"boundary marker {rule.marker!r} cannot be produced by the tokenizer of {model} "
                f"(it decodes back as {back!r}): pass --kvaudit-boundary with a marker it can spell, or tokens:K"
            )


def check_prompt_ids(item_set: ItemSet, vocab_size: int, model: str) -> None:
    """Given prompt ids outside the embedding would index past it (a crash, or garbage on some devices)."""
    for item in item_set.items:
        bad = next((t for t in item.prompt_ids or () if t >= vocab_size), None)
        if bad is not None:
            raise KvauditError(
                f"{item.where or item_set.path}: item {item.id!r}: prompt id {bad} is outside the vocabulary of "
                f"{model} ({vocab_size} ids, 0..{vocab_size - 1}): the ids come from another tokenizer"
            )


def item_set_name(item_set: ItemSet) -> str:
    """The item set as a report names it: its file, the embedded checkpoint's set, or the built-in set's name."""
    path = item_set.path
    p = str(path)
    if p.startswith("<") and p.endswith(">"):
        return p[1:-1]
    return f"{EMBEDDED_NAME}:{path.name}" if path.resolve().parent == EMBEDDED_DIR.resolve() else p
