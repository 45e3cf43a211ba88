"""Properties of the cache adapter and the constructions over random small models and prompts."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from pytest_kvaudit.core.errors import KvauditError  # noqa: E402
from pytest_kvaudit.core.model.config import BoundaryRule  # noqa: E402
from pytest_kvaudit.core.runtime import state as kv  # noqa: E402
from pytest_kvaudit.core.runtime.decoder import Decoder, continue_greedy, schedule, trajectory  # noqa: E402
from pytest_kvaudit.engines.transformers.backend import TransformersBackend  # noqa: E402

VOCAB = 23


@lru_cache(maxsize=16)
def model(arch: str, layers: int, hidden: int, dtype: str, seed: int) -> Any:
    import transformers

    cls = {"llama": "LlamaConfig", "qwen2": "Qwen2Config"}[arch]
    cfg = getattr(transformers, cls)(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=64, eos_token_id=0)
    torch.manual_seed(seed)
    m = transformers.AutoModelForCausalLM.from_config(cfg).to(getattr(torch, dtype)).eval()
    return m


configs = st.tuples(st.sampled_from(["llama", "qwen2"]), st.integers(1, 3), st.sampled_from([16, 32]),
                    st.sampled_from(["float32", "bfloat16"]), st.integers(0, 3))
prompts = st.lists(st.integers(1, VOCAB - 1), min_size=1, max_size=8)


def decode(ids: Any) -> str:
    return " ".join(map(str, ids))


def _run(cfg: tuple, prompt: list[int], k: int) -> tuple[Decoder, Any]:
    m = model(*cfg)
    dec = Decoder(TransformersBackend.of_model(m), frozenset())  # no EOS: fixed-length generations
    tr = trajectory(dec, prompt, k + 6, BoundaryRule(tokens=k), decode, keep_state=True)
    return dec, tr


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, prompts, st.integers(1, 5))
def test_replaying_the_live_schedule_equals_the_live_cache(cfg: tuple, prompt: list[int], k: int) -> None:
    dec, tr = _run(cfg, prompt, k)
    head = list(tr.prefix[:-1])
    replay = dec.build_state(head, schedule("incremental", len(prompt), len(head)))
    assert kv.equal(replay, tr.state)
    assert kv.fingerprint(replay) == tr.state_fp
    suffix, lfp = continue_greedy(dec, replay, tr.prefix[-1], 6)
    assert suffix == tr.suffix and lfp == tr.logits_fp


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, prompts, st.integers(1, 5))
def test_whole_cache_transplant_continues_as_the_donor(cfg: tuple, prompt: list[int], k: int) -> None:
    dec, tr = _run(cfg, prompt, k)
    head = list(tr.prefix[:-1])
    donor = dec.build_state(head, [len(head)])
    donor_suffix, donor_lfp = continue_greedy(dec, kv.clone(donor), tr.prefix[-1], 6)
    moved = kv.transplant(tr.state, donor)
    assert kv.fingerprint(moved) == kv.fingerprint(donor)
    suffix, lfp = continue_greedy(dec, moved, tr.prefix[-1], 6)
    assert (suffix, lfp) == (donor_suffix, donor_lfp)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, prompts, st.data())
def test_one_bit_anywhere_changes_the_fingerprint(cfg: tuple, prompt: list[int], data: st.DataObject) -> None:
    dec, tr = _run(cfg, prompt, 2)
    c = kv.clone(tr.state)
    pairs = kv.layer_kv(c)
    li = data.draw(st.integers(0, len(pairs) - 1))
    t = pairs[li][data.draw(st.integers(0, 1))]
    raw = t.view(torch.uint8).view(-1)
    pos = data.draw(st.integers(0, raw.numel() - 1))
    bit = data.draw(st.integers(0, 7))
    raw[pos] ^= 1 << bit
    assert kv.fingerprint(c) != kv.fingerprint(tr.state)
    assert not kv.equal(c, tr.state)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, prompts)
def test_a_clone_shares_no_storage(cfg: tuple, prompt: list[int]) -> None:
    dec, tr = _run(cfg, prompt, 2)
    c = kv.clone(tr.state)
    before = kv.fingerprint(tr.state)
    for (k1, v1), (k2, v2) in zip(kv.layer_kv(c), kv.layer_kv(tr.state)):
        assert k1.untyped_storage().data_ptr() != k2.untyped_storage().data_ptr()
        assert v1.untyped_storage().data_ptr() != v2.untyped_storage().data_ptr()
        k1.add_(1)
    assert kv.fingerprint(tr.state) == before


def test_partial_transplants_move_only_what_they_name() -> None:
    dec, tr = _run(("llama", 3, 16, "float32", 0), [3, 4, 5, 6], 3)
    head = list(tr.prefix[:-1])
    donor = dec.build_state(head, [len(head)])
    donor = kv.transplant(donor, donor)
    for layer in kv.layer_kv(donor):
        layer[0].add_(1)
        layer[1].add_(1)
    only_v1 = kv.transplant(tr.state, donor, layers=[1], parts="v")
    cmp = kv.compare(only_v1, tr.state)
    assert [(c.keys_equal, c.values_equal) for c in cmp] == [(True, True), (True, False), (True, True)]
    assert cmp[1].values_max_abs == pytest.approx(1.0)


def test_schedules() -> None:
    assert schedule("live", 3, 6) == [3, 1, 1, 1]
    assert schedule("prefill", 3, 6) == [6]
    assert schedule("chunked(4)", 3, 10) == [4, 4, 2]
    assert schedule("chunked(5)", 3, 10) == [5, 5]
    with pytest.raises(KvauditError, match="unknown construction"):
        schedule("spiral", 3, 6)
