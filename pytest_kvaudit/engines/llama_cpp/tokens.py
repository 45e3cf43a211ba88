"""llama.cpp's own tokenizer, shaped like the slice of a transformers tokenizer the audit calls.

The cells, the item checks and the chat prompt (:mod:`pytest_kvaudit.core.runtime.chat`) call ``tokenizer(text,
add_special_tokens=...)``,
``decode``, ``get_vocab``, ``chat_template`` and ``apply_chat_template``. Routing them to the GGUF's own
vocabulary (not a transformers re-implementation of it) keeps every id the one llama.cpp would produce itself;
the chat template is the GGUF's ``tokenizer.chat_template``, rendered with jinja2 in a sandbox, as transformers
and llama-cpp-python render it, then tokenized without a BOS of its own (the template writes what it wants).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class LlamaCppTokenizer:
    """Encode, decode and chat-render through a loaded ``llama_cpp.Llama``."""

    def __init__(self, llm: Any, name: str) -> None:
        self.llm = llm
        self.name_or_path = name
        meta = llm.metadata
        self.chat_template: str | None = meta.get("tokenizer.chat_template") or None
        self.add_bos = str(meta.get("tokenizer.ggml.add_bos_token", "false")).lower() == "true"
        self.eos_token_id = int(llm.token_eos())
        self.bos_token_id = int(llm.token_bos())
        self.pad_token_id: int | None = None  # no padding: one sequence per context
        self._vocab: dict[str, int] | None = None

    def _piece(self, i: int) -> str:
        try:
            return str(self.llm._model.token_get_text(i))
        except UnicodeDecodeError:  # a byte-fallback piece: its length still bounds the characters it covers
            return f"<0x{i:X}>"

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [int(t) for t in self.llm.tokenize(text.encode("utf-8"), add_bos=add_special_tokens and self.add_bos,
                                                  special=True)]

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": self.encode(text, add_special_tokens)}

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        raw: bytes = self.llm.detokenize(list(ids), special=not skip_special_tokens)
        return raw.decode("utf-8", errors="replace")

    def get_vocab(self) -> dict[str, int]:
        if self._vocab is None:
            self._vocab = {self._piece(i): i for i in range(int(self.llm.n_vocab()))}
        return self._vocab

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True,
                            tokenize: bool = True) -> Any:
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not self.chat_template:
            raise ValueError(f"{self.name_or_path} has no tokenizer.chat_template in its GGUF metadata")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.decode([self.bos_token_id]), eos_token=self.decode([self.eos_token_id]))
        return self.encode(text, add_special_tokens=False) if tokenize else text
