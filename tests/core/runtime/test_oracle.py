"""transformers' caches as kvaudit reads them, against transformers' own forward of the same ids
(:mod:`pytest_kvaudit.oracle`): every claim compares kvaudit's read with kvaudit's read, so only an outside oracle
catches a read that is wrong the same way every time.

What it pins, on the embedded checkpoint (FP32 and BF16) and a tiny model with a sliding-window layer beside a full
one: the K/V the transformers backend leaves in a dynamic and a static cache (a prefill, then one-token steps
through the lean step) and what kvaudit reads of them are transformers' forward of the whole prompt, each position
nearest its own (FP32: within :data:`~pytest_kvaudit.oracle.FP32_RTOL` of each layer's largest value); a write
(a transplant of the oracle's K/V) reads back bit for bit; and every one of these checks FAILS on a read that
permutes the positions inside a block of 16 (``kv_parts`` monkeypatched), every value present."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pytest_kvaudit.core.model.config import EMBEDDED_DIR
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.core.runtime.state import attention
from pytest_kvaudit.core.runtime.state.protocol import Part
from pytest_kvaudit.oracle import FP32_RTOL, check_read, permute_in_blocks, reference_kv

#: a prompt of 45 ids: a prefill of 41 and four one-token steps; the embedded vocabulary has 19 tokens, so tokens
#: repeat (equal V rows at layer 0: ties, not misses)
PROMPT, STEPS, BLOCK = 45, 4, 16


def _ids(vocab: int, n: int = PROMPT) -> list[int]:
    gen = torch.Generator().manual_seed(0)
    return [int(t) for t in torch.randint(2, vocab, (n,), generator=gen)]  # past <pad> and <eos>


def _permute(monkeypatch: pytest.MonkeyPatch) -> None:
    """kvaudit's read of attention layers, its positions reversed inside each block of 16."""
    real = attention.kv_parts

    def permuted(layer: Any) -> list[Part]:
        out = []
        for p in real(layer):
            idx = permute_in_blocks(int(p.tensor.shape[-2]), BLOCK)
            out.append(Part(p.name, p.side, p.tensor[..., idx, :], p.attention, p.positional))
        return out

    monkeypatch.setattr(attention, "kv_parts", permuted)


def _filled(backend: Any, ids: list[int], kind: str) -> Any:
    """The backend's own cache of ``ids``: one forward of all but the last few, then a forward a token."""
    cache = backend.fresh(kind, len(ids) + 8)
    backend.step(ids[:-STEPS], cache)
    for t in ids[-STEPS:]:
        backend.step([t], cache)
    return cache


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def embedded(request: pytest.FixtureRequest) -> Any:
    from pytest_kvaudit.engines.transformers.backend import open_backend

    return open_backend(str(EMBEDDED_DIR), request.param)


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("permuted", [False, True], ids=["read", "permuted-in-block"])
def test_the_read_of_a_cache_is_transformers_forward(embedded: Any, kind: str, permuted: bool,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ids = _ids(int(embedded.model.config.vocab_size))
    cache = _filled(embedded, ids, kind)
    if permuted:
        _permute(monkeypatch)
    check = check_read(kv.layer_kv(cache), reference_kv(embedded.model, ids))
    rtol = FP32_RTOL if embedded.dtype == "fp32" else None
    if not permuted:
        check.assert_ok(rtol)
        return
    with pytest.raises(AssertionError, match="rows nearest another position"):
        check.assert_ok()  # the positions alone catch it, in BF16 too
    if rtol is not None:
        assert check.max_rel > 100 * rtol


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("permuted", [False, True], ids=["write", "permuted-in-block"])
def test_a_write_reads_back_and_continues_as_the_forward(embedded: Any, kind: str, permuted: bool,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The oracle's K/V written into the backend's cache (a transplant: a donor's state into every layer) read
    back bit for bit, and the backend's next step on it gives transformers' logits of the prompt and that token
    (FP32: within the tolerance). A write that permutes the positions inside a block fails the read-back, and
    only that: the next step's logits do not see it (attention over (K, V) pairs is order-free once RoPE is in K),
    which is why a read is checked against the oracle and not by what the engine makes of it."""
    ids = _ids(int(embedded.model.config.vocab_size), PROMPT + 1)
    receiver = _filled(embedded, ids[:-1], kind)
    ref = reference_kv(embedded.model, ids[:-1])
    donor = kv.new_cache(embedded.model)
    for i, (k, v) in enumerate(ref):
        donor.update(k[None].clone(), v[None].clone(), i)
    if permuted:
        real = attention.write_kv
        monkeypatch.setattr(attention, "write_kv", lambda layer, name, value: real(
            layer, name, value[..., permute_in_blocks(int(value.shape[-2]), BLOCK), :]))
    moved = kv.transplant(receiver, donor)
    back = kv.layer_kv(moved)
    assert all(torch.equal(k[0], rk) and torch.equal(v[0], rv) for (k, v), (rk, rv) in zip(back, ref)) is not permuted
    if embedded.dtype != "fp32":
        return
    got = embedded.step(ids[-1:], moved).float()
    with torch.no_grad():
        want = embedded.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    rel = float((got - want).abs().max() / want.abs().max())
    assert rel <= FP32_RTOL, rel


def _sliding_model() -> Any:
    """A random 2-layer Qwen2 whose first layer slides over 8 positions and whose second attends to all."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=128, use_sliding_window=True, sliding_window=8,
                      layer_types=["sliding_attention", "full_attention"])
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("permuted", [False, True], ids=["read", "permuted-in-block"])
def test_a_sliding_window_layer_holds_the_last_positions(kind: str, permuted: bool,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The sliding layer's read is the oracle's last positions (as many as the layer holds), the full layer's all
    of them; the permuted read fails (its window is one block: reversed)."""
    from pytest_kvaudit.engines.transformers.backend import TransformersBackend

    backend = TransformersBackend.of_model(_sliding_model())
    ids = _ids(32, 30)
    cache = _filled(backend, ids, kind)
    assert kv.kinds(cache) == ["sliding(8)", "full"]
    if permuted:
        _permute(monkeypatch)
    read = kv.layer_kv(cache)
    assert int(read[0][0].shape[-2]) < len(ids) == int(read[1][0].shape[-2])
    check = check_read(read, reference_kv(backend.model, ids))
    if not permuted:
        check.assert_ok(FP32_RTOL)
        return
    with pytest.raises(AssertionError, match="rows nearest another position"):
        check.assert_ok()
