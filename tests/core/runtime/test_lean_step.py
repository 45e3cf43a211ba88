"""The lean decode step (:mod:`pytest_kvaudit.core.runtime.lean_step`) gives transformers' bits, proves it on its
first step, falls back where one bit differs, and leaves every model and cache it does not know to
transformers' forward."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pytest_kvaudit.core.model.config import EMBEDDED_DIR, BoundaryRule
from pytest_kvaudit.core.runtime.decoder import Decoder, continue_greedy, trajectory
from pytest_kvaudit.core.runtime.lean_step import LeanStep, refusal
from pytest_kvaudit.engines.transformers.backend import open_backend


def _run(backend: Any, prompt: list[int], lean: bool) -> tuple[Any, ...]:
    """A trajectory and a continuation from a prefilled state: every bit the audit compares."""
    from pytest_kvaudit.core.runtime import state as kv

    backend.lean = lean
    dec = Decoder(backend, frozenset())
    tr = trajectory(dec, prompt, 24, BoundaryRule(tokens=3), lambda ids: "", keep_state=True)
    st = dec.build_state(prompt[:-1], [len(prompt) - 1])
    margins: list[float] = []
    suffix, lfp = continue_greedy(dec, st, prompt[-1], 12, margins)
    return (tr.generated, tr.state_fp, tr.logits_fp, tr.margins, kv.fingerprint(tr.state), suffix, lfp, margins,
            kv.fingerprint(st))


@pytest.fixture(scope="module", params=["embedded", "llama"])
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if request.param == "embedded":
        return Path(EMBEDDED_DIR)
    from pytest_kvaudit.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("lean-llama"), "llama", n_items=2)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_lean_gives_transformers_bits(checkpoint: Path, dtype: str) -> None:
    b = open_backend(str(checkpoint), dtype, "cpu", attn="sdpa")
    prompt = b.encode("S 3 7 1 9 4:" if checkpoint == Path(EMBEDDED_DIR) else "abc def")
    lean = _run(b, prompt, True)
    assert b._lean is not None and b._lean.reason is None and b._lean.verified
    assert lean == _run(b, prompt, False)
    assert len(lean[0]) == 24


def test_a_differing_bit_turns_it_off_and_returns_transformers_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first-step check can fail: a lean step one ulp off is caught, and the step's result and cache are
    transformers' own, so the audit's bits do not move."""
    import torch

    b = open_backend(str(EMBEDDED_DIR), "fp32", "cpu")
    prompt = b.encode("S 3 7 1 9 4:")
    want = _run(b, prompt, False)
    honest = LeanStep._step

    def off_by_one_ulp(self: LeanStep, tok: int, cache: Any) -> Any:
        out = honest(self, tok, cache)
        return torch.nextafter(out, torch.full_like(out, float("inf")))

    monkeypatch.setattr(LeanStep, "_step", off_by_one_ulp)
    b._lean = None
    assert _run(b, prompt, True) == want
    assert b._lean is not None and not b._lean.verified
    assert b._lean.reason == "its first step differed from transformers' forward"


def test_a_differing_cache_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    b = open_backend(str(EMBEDDED_DIR), "fp32", "cpu")
    prompt = b.encode("S 3 7 1 9 4:")
    want = _run(b, prompt, False)
    honest = LeanStep._step

    def bad_cache(self: LeanStep, tok: int, cache: Any) -> Any:
        out = honest(self, tok, cache)
        cache.layers[-1].values[..., -1, 0] += 1
        return out

    monkeypatch.setattr(LeanStep, "_step", bad_cache)
    b._lean = None
    assert _run(b, prompt, True) == want
    assert b._lean is not None and b._lean.reason is not None


def test_what_it_does_not_know_goes_to_transformers(tmp_path: Path) -> None:
    from pytest_kvaudit.core.runtime import state as kv

    eager = open_backend(str(EMBEDDED_DIR), "fp32", "cpu", attn="eager")
    assert refusal(eager.model) == "attention 'eager', not sdpa"
    b = open_backend(str(EMBEDDED_DIR), "fp32", "cpu")
    assert refusal(b.model) is None
    lean = LeanStep(b.model)
    assert not lean.applies([1, 2], kv.new_cache(b.model))  # a chunk: transformers' forward (its mask)
    assert not lean.applies([1], kv.new_cache(b.model, "static", 32))
    assert lean.applies([1], kv.new_cache(b.model))
    handle = b.model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    try:
        assert refusal(b.model) == "a hook on Qwen2MLP"
    finally:
        handle.remove()
    b.model.train()
    try:
        assert refusal(b.model) == "training mode"
    finally:
        b.model.eval()
    # a model class it does not reproduce op for op
    from pytest_kvaudit.testing import tiny_checkpoint

    other = open_backend(str(tiny_checkpoint(tmp_path / "gpt2", "gpt2", n_items=1)), "fp32", "cpu")
    assert "is not one of LlamaForCausalLM, Qwen2ForCausalLM" in str(refusal(other.model))
