"""Prompt ids through a tokenizer's chat template, the same on transformers 4.57 and 5.x.

``apply_chat_template(..., tokenize=True)`` changed its return type between the majors: 4.57 returns a
``list[int]`` (``return_dict=False`` by default), 5.x a ``BatchEncoding`` (``return_dict=True`` by
default). ``BatchEncoding`` is a ``UserDict``, not a ``dict``, so a check for ``dict`` misses it and
iterating it yields its keys. Rather than pass ``return_dict`` (whose default and warnings differ per
major) this module accepts every shape either major can give and reduces it to one tuple of ints.

Pure Python at import: transformers and torch are never imported here; the tokenizer is duck-typed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kvaudit.engine.errors import KvauditError

FLAG = "--kvaudit-chat-template"


def _model_name(tokenizer: Any, model: str | None) -> str:
    return model or str(getattr(tokenizer, "name_or_path", "") or "") or type(tokenizer).__name__


def _to_ids(out: Any, where: str) -> tuple[int, ...]:
    """``apply_chat_template``'s output in any of its shapes -> one sequence of token ids.

    Shapes: ``list[int]``; a mapping (``BatchEncoding`` or ``dict``) holding ``input_ids``; a batch of
    one (``[[...]]``); a tensor or array (anything with ``tolist``), of one or two dimensions.
    """
    if isinstance(out, Mapping):
        if "input_ids" not in out:
            raise KvauditError(f"{FLAG}: the chat template of {where} returned no input_ids (keys: {sorted(out)})")
        out = out["input_ids"]
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
        out = out.tolist()
    if isinstance(out, (list, tuple)) and out and (isinstance(out[0], (list, tuple)) or getattr(out[0], "ndim", 0) >= 1):
        if len(out) != 1:
            raise KvauditError(f"{FLAG}: the chat template of {where} returned a batch of {len(out)}, expected one prompt")
        out = out[0]
        if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):
            out = out.tolist()
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence) or not all(_is_id(t) for t in out):
        raise KvauditError(f"{FLAG}: the chat template of {where} returned {type(out).__name__}, not token ids")
    if not out:
        raise KvauditError(f"{FLAG}: the chat template of {where} rendered an empty prompt")
    return tuple(int(t) for t in out)


def _is_id(t: Any) -> bool:
    """A token id: an int (numpy and torch scalars included via ``__index__``), never a bool."""
    if isinstance(t, bool):
        return False
    if isinstance(t, int):
        return t >= 0
    index = getattr(t, "__index__", None)
    if index is None or getattr(t, "ndim", 0) != 0:
        return False
    return bool(index() >= 0)


def chat_prompt_ids(tokenizer: Any, text: str, model: str | None = None) -> tuple[int, ...]:
    """The ids of ``text`` as one user turn with the generation prompt, as a chat model is meant to see it.

    ``model`` names the checkpoint in errors (default: the tokenizer's ``name_or_path``). Raises a
    one-line ``KvauditError`` when the tokenizer has no chat template, the template fails to render, or
    it renders nothing, rather than transformers' multi-line ValueError or a traceback further down.
    """
    where = _model_name(tokenizer, model)
    if not getattr(tokenizer, "chat_template", None):
        raise KvauditError(
            f"{FLAG}: the tokenizer of {where} has no chat template: drop the flag or add chat_template to "
            "tokenizer_config.json (or a chat_template.jinja beside it)"
        )
    try:
        out = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
    except Exception as exc:  # a template is user input: jinja errors, raise_exception(), role checks
        raise KvauditError(f"{FLAG}: the chat template of {where} failed: {type(exc).__name__}: {exc}") from exc
    return _to_ids(out, where)
