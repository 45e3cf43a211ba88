"""Prompt ids through a tokenizer's chat template, the same on transformers 4.57 and 5.x, and when a run uses it.

When: ``--kvaudit-chat-template=auto`` (the default) applies the template whenever the checkpoint ships one
(:func:`template_source`: ``chat_template.jinja``, ``chat_template.json``, ``tokenizer_config.json``'s
``chat_template``, or a GGUF's ``tokenizer.chat_template``) and the items are text prompts: an instruct
model fed a bare prompt rambles past every boundary (SmolLM2's GGUF without its template: 0/8 items
eligible, six INCONCLUSIVE verdicts). ``on`` (also the bare flag, as before) requires a template; ``off``
sends prompts as plain text, and a run where that leaves items short of their boundary names the template
as the likely cause (:func:`missed_template_hint`). Items given as ``prompt_ids`` are never wrapped.

``apply_chat_template(..., tokenize=True)`` changed its return type between the majors: 4.57 returns a
``list[int]`` (``return_dict=False`` by default), 5.x a ``BatchEncoding`` (``return_dict=True`` by
default). ``BatchEncoding`` is a ``UserDict``, not a ``dict``, so a check for ``dict`` misses it and
iterating it yields its keys. Rather than pass ``return_dict`` (whose default and warnings differ per
major) this module accepts every shape either major can give and reduces it to one tuple of ints.

Pure Python at import: transformers and torch are never imported here; the tokenizer is duck-typed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.runtime import gguf

FLAG = "--kvaudit-chat-template"
#: the flag's values -> AuditConfig.chat_template: None decides per checkpoint (auto)
MODES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}
#: what an ini file may still say from when the option was a bool
_INI_WORDS: dict[str, bool | None] = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def parse_mode(text: str, where: str = FLAG) -> bool | None:
    """``auto``/``on``/``off`` (and the old ini booleans) -> None/True/False, or one line naming the values."""
    key = text.strip().lower()
    if key in MODES:
        return MODES[key]
    if key in _INI_WORDS:
        return _INI_WORDS[key]
    # the bare flag takes the next word as its value: a test path after it lands here
    after = (f" (the bare flag took {text!r} as its value: write {FLAG}=on before test paths)" if Path(text).exists()
             else "")
    raise KvauditError(f"{where}={text!r}: use auto (the default: the template when the checkpoint ships one), on or "
                       "off"
                       + after)


def mode_name(chat_template: bool | None) -> str:
    return {None: "auto", True: "on", False: "off"}[chat_template]


def template_source(checkpoint: Path) -> str | None:
    """Where a local checkpoint keeps its chat template (a file name, or the GGUF key), None when it has none.

    Read from the files, without loading a tokenizer, so the header can say it before anything loads; the
    files are the ones transformers reads the template from."""
    try:
        file = gguf.gguf_file(checkpoint)
        if file is not None:
            meta = gguf.read_header(file)["metadata"]
            return f"{file.name} (tokenizer.chat_template)" if meta.get("tokenizer.chat_template") else None
    except KvauditError:  # several GGUF files, no gguf package, an unreadable file: loading says which
        return None
    for name in ("chat_template.jinja", "chat_template.json"):
        if (checkpoint / name).is_file():
            return name
    config = checkpoint / "tokenizer_config.json"
    try:
        has = bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template")) if config.is_file() else False
    except (OSError, ValueError, AttributeError):  # a broken config is reported where the tokenizer loads
        return None
    return config.name if has else None


def applies(chat_template: bool | None, source: str | None, prompts: Iterable[Any]) -> bool:
    """Whether a run wraps its text prompts: on, or auto with a template shipped and a text prompt to wrap."""
    if chat_template is not None:
        return chat_template
    return source is not None and any(getattr(p, "prompt_ids", None) is None for p in prompts)


def header_line(chat_template: bool | None, source: str | None) -> str:
    """The run header's line: whether prompts go through the template, from which file, and how to change it."""
    if chat_template is None and source is not None:
        return (f"chat template: on for text prompts (auto: the checkpoint ships one in {source}); "
                f"{FLAG}=off sends them as plain text")
    if chat_template is None:
        return "chat template: none shipped with the checkpoint, prompts go as plain text"
    if chat_template:
        return f"chat template: on ({FLAG}=on{', from ' + source if source else ''}); {FLAG}=off turns it off"
    return (f"chat template: off ({FLAG}=off)" + (f", though the checkpoint ships one in {source}" if source else ""))


def report_block(requested: bool | None, applied: bool, source: str | None) -> dict[str, Any]:
    """The report's ``items.chat_template`` (mode asked, applied or not, the template's file), or nothing for a
    checkpoint with no template that nobody asked about: such a run's report stays as it was."""
    if source is None and requested is None and not applied:
        return {}
    return {"chat_template": {"mode": mode_name(requested), "applied": applied, "source": source}}


def checkpoint_source(model: str) -> str | None:
    """:func:`template_source` of a ``--kvaudit-model`` that names a local path; None for a hub id not yet fetched
    (nothing is downloaded to say it)."""
    p = Path(model).expanduser()
    return template_source(p.resolve()) if p.exists() else None


def missed_template_hint(chat_template: bool | None, source: str | None) -> str:
    """What a run whose items never reach their boundary should try, when a shipped template was left off."""
    if chat_template is not False or source is None:
        return ""
    return (f"; the chat template ({source}) was off ({FLAG}=off): an instruct model fed bare prompts rarely "
            f"reaches the boundary, so {FLAG}=auto or on is the likely fix")


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
    if isinstance(out, (list, tuple)) and out and (isinstance(out[0], (list, tuple))
                                                   or getattr(out[0], "ndim", 0) >= 1):
        if len(out) != 1:
            raise KvauditError(f"{FLAG}: the chat template of {where} returned a batch of {len(out)}, expected one "
                               "prompt")
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
