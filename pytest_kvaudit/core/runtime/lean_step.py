"""One decode step of a Llama or Qwen2 checkpoint without transformers' module machinery: the same torch
ops on the same inputs, in the same order, so the same bits, at a lower per-call cost.

Why: the audit decodes one token per forward, and on a small model most of a forward is Python, not
arithmetic. ``LlamaForCausalLM.forward`` runs ~20 wrapped module calls per layer (``__call__``, decorators,
output capturing, the mask builder that returns None for one query token, keyword plumbing); the ops
themselves are the projections, the RMS norms, the rotary embedding, the cache append and SDPA. Calling those
directly (the norms', rotary embedding's and activation's own ``forward``, transformers' own
``apply_rotary_pos_emb`` and ``sdpa_attention_forward``, ``F.linear`` as ``nn.Linear.forward`` does,
``cache.update`` as the attention layer does) measured 1.2x on SmolLM2-135M and 2x on the embedded
checkpoint per decode step, bit for bit (``benchmarks/decode_overhead.py`` and ``real_model.py``).

Only what it knows is taken: one token on a ``DynamicCache`` of full-attention layers, SDPA, plain
``nn.Linear`` projections, no module hooks; a layer that the ``kernels`` package replaced is called the way
transformers calls it (its ``forward``, or the module-level function). Anything else is transformers' own
forward.
And it proves itself: the first step of every :class:`LeanStep` also runs transformers' forward on a copy of
the cache and compares the logits and every layer's K and V with ``torch.equal``; a single differing bit
turns it off for good (``reason`` says why) and that step's result is transformers' own.
"""

from __future__ import annotations

import copy
import sys
from typing import Any

from pytest_kvaudit.core.runtime.state.forward_kwarg import cache_kwarg

#: causal LM classes whose decoder layer this step reproduces op for op (checked at the first step)
KNOWN = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM"})


def refusal(model: Any) -> str | None:
    """Why ``model`` does not get the lean step (None when it does)."""
    import torch

    name = type(model).__name__
    if name not in KNOWN:
        return f"{name} is not one of {', '.join(sorted(KNOWN))}"
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention {getattr(cfg, '_attn_implementation', None)!r}, not sdpa"
    if model.training:
        return "training mode"
    if (any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or ()))
            or getattr(cfg, "use_sliding_window", False)):
        return "a sliding-window layer"
    if getattr(cfg, "pretraining_tp", 1) not in (1, None):
        return "pretraining_tp > 1"
    for mod in model.modules():
        if mod._forward_hooks or mod._forward_pre_hooks or getattr(mod, "_hf_hook", None) is not None:
            return f"a hook on {type(mod).__name__}"
        if isinstance(mod, torch.nn.Linear) and type(mod) is not torch.nn.Linear:
            return f"a {type(mod).__name__} projection"
    from torch.nn.modules import module as M

    if M._global_forward_hooks or M._global_forward_pre_hooks:
        return "a global module hook"
    return None


class LeanStep:
    """The decode step of one model; :meth:`step` returns None where transformers' forward must run."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.reason = refusal(model)
        self.verified = False
        if self.reason is not None:
            return
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        self.cache_types = (DynamicCache, DynamicLayer)
        self.sdpa = sdpa_attention_forward
        inner = model.model
        self.embed, self.rotary, self.norm = inner.embed_tokens, inner.rotary_emb, inner.norm
        self.layers = list(inner.layers[: model.config.num_hidden_layers])
        self.rope = sys.modules[type(self.layers[0].self_attn).__module__].apply_rotary_pos_emb
        self.device = next(model.parameters()).device

    def applies(self, ids: Any, cache: Any) -> bool:
        if self.reason is not None or len(ids) != 1:
            return False
        dyn, layer = self.cache_types
        return type(cache) is dyn and all(type(x) is layer for x in cache.layers)

    def step(self, ids: Any, cache: Any) -> Any:
        """The next-token logits (``[vocab]``) of ``ids`` (one id) on ``cache`` (appended to), or None."""
        if not self.applies(ids, cache):
            return None
        if self.verified:
            return self._step(int(ids[0]), cache)
        return self._first(int(ids[0]), cache)

    def _first(self, tok: int, cache: Any) -> Any:
        """The lean step checked bit for bit against transformers' forward on a copy of the same cache."""
        import torch


        theirs = copy.deepcopy(cache)
        x = torch.tensor([[tok]], dtype=torch.long, device=self.device)
        with torch.no_grad():
            ref = self.model(input_ids=x, use_cache=True, logits_to_keep=1,
                             **{cache_kwarg(self.model): theirs}).logits[0, -1]
        mine = self._step(tok, cache)
        same = torch.equal(mine, ref) and all(
            torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
            for a, b in zip(cache.layers, theirs.layers))
        if not same:
            self.reason = "its first step differed from transformers' forward"
            cache.layers[:] = theirs.layers  # the caller gets transformers' own cache and logits
            return ref
        self.verified = True
        return mine

    def _step(self, tok: int, cache: Any) -> Any:
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            x = self.embed.forward(torch.tensor([[tok]], dtype=torch.long, device=self.device))
            pos = torch.arange(1, device=self.device) + cache.get_seq_length()
            cos, sin = self.rotary.forward(x, pos.unsqueeze(0))
            for i, layer in enumerate(self.layers):
                attn, mlp = layer.self_attn, layer.mlp
                h = layer.input_layernorm.forward(x)
                shape = (1, 1, -1, attn.head_dim)
                q = F.linear(h, attn.q_proj.weight, attn.q_proj.bias).view(shape).transpose(1, 2)
                k = F.linear(h, attn.k_proj.weight, attn.k_proj.bias).view(shape).transpose(1, 2)
                v = F.linear(h, attn.v_proj.weight, attn.v_proj.bias).view(shape).transpose(1, 2)
                q, k = self.rope(q, k, cos, sin)
                k, v = cache.update(k, v, i)
                a, _ = self.sdpa(attn, q, k, v, None, dropout=0.0, scaling=attn.scaling)
                a = a.reshape(1, 1, -1).contiguous()
                x = x + F.linear(a, attn.o_proj.weight, attn.o_proj.bias)
                h = layer.post_attention_layernorm.forward(x)
                gate = mlp.act_fn.forward(F.linear(h, mlp.gate_proj.weight, mlp.gate_proj.bias))
                x = x + F.linear(gate * F.linear(h, mlp.up_proj.weight, mlp.up_proj.bias), mlp.down_proj.weight,
                                 mlp.down_proj.bias)
            x = self.norm.forward(x)
            head = self.model.lm_head
            return F.linear(x[:, -1:, :], head.weight, head.bias)[0, -1]
