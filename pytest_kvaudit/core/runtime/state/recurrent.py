"""Recurrent layers (transformers' linear-attention layer: Mamba, LFM2's convolutions, Qwen3-Next's gated
delta net...). The hybrids that carry attention K/V beside a recurrent state in one layer are composed of
this and an attention adapter in :mod:`.registry`.

A recurrent layer's state is one or more convolution states (the last few inputs of a causal conv) and
recurrent (SSM) states, each of a fixed size whatever the length; its token counter and "has a previous
state" flags are counters, compared as values. Both tensors are the state: a transplant carries both.
"""

from __future__ import annotations

from typing import Any

from pytest_kvaudit.core.runtime.state.protocol import Part

_LINEAR = frozenset({"number_of_states", "conv_states", "recurrent_states", "is_conv_states_initialized",
                     "is_recurrent_states_initialized", "has_previous_state", "conv_kernel_size",
                     "cumulative_length_linear", "device", "dtype", "record_past", "recurrent_states_history",
                     "conv_states_history"})


class Recurrent:
    """``LinearAttentionLayer``: conv and recurrent states, ``conv.i`` and ``recurrent.i`` per state index."""

    attributes: frozenset[str] = _LINEAR

    def describe(self, layer: Any) -> str:
        return "recurrent"

    def parts(self, layer: Any) -> list[Part]:
        out = []
        for i in range(int(getattr(layer, "number_of_states", 1))):
            for attr, side in (("conv_states", "k"), ("recurrent_states", "v")):
                t = (getattr(layer, attr, None) or {}).get(i)
                if t is not None:
                    out.append(Part(f"{attr.split('_')[0]}.{i}", side, t, attention=False, positional=False))
        return out

    def counters(self, layer: Any) -> dict[str, Any]:
        length = getattr(layer, "cumulative_length_linear", 0)
        return {"linear_length": int(length), "has_previous_state": dict(getattr(layer, "has_previous_state", {}))}

    def write(self, layer: Any, name: str, value: Any) -> None:
        kind, i = name.split(".")
        states = getattr(layer, f"{kind}_states")
        dst = states[int(i)]
        if dst is None:
            states[int(i)] = value.detach().clone()
        else:  # preallocated at a static address: copy in place
            dst.copy_(value.detach().to(dst.device))

    def bytes_per_position(self, layer: Any) -> int:
        return 0
