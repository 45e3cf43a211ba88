"""The transformers backend: a checkpoint loaded by :mod:`pytest_kvaudit.core.runtime.loading` (safetensors only, no
remote code unless asked, refusals of what the audit cannot judge), run one forward at a time on a transformers
``Cache``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.model.items import token_text
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.core.runtime.lean_step import LeanStep
from pytest_kvaudit.core.runtime.loading import ModelHandle, open_model


@dataclass
class TransformersBackend(ModelHandle):
    """A loaded transformers model with what the audit calls on it
    (:class:`pytest_kvaudit.core.model.engine_protocol.Backend`)."""

    #: one-token steps through :class:`.lean.LeanStep` where it applies (the same ops, the same bits, less
    #: Python per call; it checks itself against transformers' forward on its first step); False: always
    #: transformers' forward (the benchmarks' reference)
    lean: bool = True
    _lean: LeanStep | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of_model(cls, model: Any, eos_ids: frozenset[int] = frozenset(), tokenizer: Any = None) -> TransformersBackend:
        """A backend over a model already in memory (benchmarks, tests and notebooks that built one)."""
        return cls(model=model, tokenizer=tokenizer, dtype=str(getattr(model, "dtype", "")),
                   device=str(next(model.parameters()).device), attn_implementation="", identity={}, eos_ids=eos_ids)

    @property
    def _device(self) -> Any:
        return next(self.model.parameters()).device

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return token_text(self.tokenizer, ids)

    def fresh(self, kind: str = "dynamic", max_len: int | None = None) -> Any:
        return kv.new_cache(self.model, kind, max_len)

    def step(self, ids: Sequence[int], state: Any) -> Any:
        import torch

        if self.lean:
            if self._lean is None or self._lean.model is not self.model:
                self._lean = LeanStep(self.model)
            logits = self._lean.step(ids, state)
            if logits is not None:
                return logits
        x = torch.tensor([list(ids)], dtype=torch.long, device=self._device)
        with torch.no_grad():
            out = self.model(input_ids=x, use_cache=True, logits_to_keep=1, **{kv.cache_kwarg(self.model): state})
        return out.logits[0, -1]

    def step_batch(self, rows: Sequence[Sequence[int]], pad: int) -> Any:
        import torch

        width = max(len(r) for r in rows)
        dev = self._device
        ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=dev)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = self.fresh()
        with torch.no_grad():
            self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                       **{kv.cache_kwarg(self.model): cache})
        return cache

    def shape(self) -> dict[str, int]:
        c = self.model.config.get_text_config() if hasattr(self.model.config, "get_text_config") else self.model.config
        layers = int(getattr(c, "num_hidden_layers", 0) or getattr(c, "n_layer", 0))
        heads = int(getattr(c, "num_attention_heads", 0) or getattr(c, "n_head", 0) or 1)
        kv_heads = int(getattr(c, "num_key_value_heads", None) or heads)
        hidden = int(getattr(c, "hidden_size", 0) or getattr(c, "n_embd", 0))
        head_dim = int(getattr(c, "head_dim", None) or (hidden // heads if heads else 0))
        # a fresh cache's layer classes say whether any layer carries recurrent state (no forward needed)
        fresh = [type(layer).__name__ for layer in kv.layers_of(self.fresh())]
        return {"layers": layers, "kv_heads": kv_heads, "head_dim": head_dim,
                "parameters": int(sum(p.numel() for p in self.model.parameters())),
                "recurrent": int(any(kv.LINEAR_LAYER in name for name in fresh))}


def open_spec(spec: OpenSpec) -> TransformersBackend:
    """The transformers engine's opener (:attr:`pytest_kvaudit.core.engine.record.EngineSpec.opener`)."""
    return TransformersBackend(**vars(open_model(spec)))


def open_backend(model: str, dtype: str, device: str = "auto", attn: str | None = None) -> TransformersBackend:
    """:func:`open_spec` for scripts and benchmarks that name only the model, precision, device and attention."""
    return open_spec(OpenSpec(model, dtype, device, attn))
