"""The llama.cpp backend on the real SmolLM2-135M-Instruct GGUF, run natively (Q4_1 weights, llama.cpp's kernels).

What it pins: the GGUF loads with its identity and the engine's version; greedy decoding through the audit's
decoder is token for token what llama-cpp-python's own ``Llama.generate`` gives (an independent path: its
sampler, its batch, its eval); ``warm`` really hit the engine's prompt cache (tokens reused > 0); ``restore``
is bit-exact with live; a sham transplant moves nothing, a whole one moves everything, a per-layer one is
refused naming the backend; and a short audit gives a verdict for each of the six claims.
Skipped, saying why, where llama-cpp-python is not installed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.runtime import state as kv

llama_cpp = pytest.importorskip("llama_cpp",
                                reason="llama-cpp-python is not installed: pip install 'pytest-kvaudit[llamacpp]'")

PROMPT = "What is 12 + 7? Show your steps."
#: prefix_cache judges llama.cpp inconclusive, saying why (its prompt cache has no blocks)
CLAIMS = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "prefix_cache",
          "donor_following", "ledger_audit")


#: every test here loads the real model into llama.cpp: the full tier
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gguf() -> Path:
    from pytest_kvaudit.testing import smollm2

    try:
        return smollm2()[0]
    except RuntimeError as exc:
        pytest.skip(f"SmolLM2's GGUF could not be fetched: {exc}")


@pytest.fixture(scope="module")
def backend(gguf: Path) -> Any:
    from pytest_kvaudit.core.runtime.backends import open_backend

    return open_backend("llama.cpp", str(gguf), "fp32")


@pytest.fixture(scope="module")
def prompt(backend: Any) -> list[int]:
    from pytest_kvaudit.core.runtime.chat import chat_prompt_ids

    return list(chat_prompt_ids(backend.tokenizer, PROMPT))


def greedy(dec: Any, state: Any, first: int, n: int) -> list[int]:
    from pytest_kvaudit.core.runtime.decoder import continue_greedy

    return list(continue_greedy(dec, state, first, n)[0])


def test_the_gguf_loads_natively_with_its_identity(backend: Any) -> None:
    ident = backend.identity
    assert ident["backend"] == "llama.cpp" and ident["weights_digest"].startswith("sha256:")
    assert ident["gguf"] == {"file": "SmolLM2-135M-Instruct.Q4_1.gguf", "quantization": "Q4_1", "dequantized": False}
    assert backend.shape()["layers"] == ident["num_layers"] == 30 and ident["architecture"] == "LlamaForCausalLM"
    assert backend.environment["llama_cpp_python"] == llama_cpp.__version__
    assert backend.environment["kv_cache_type"] == {"fp32": "f32"} and backend.environment["n_threads"] == 1


def test_greedy_decoding_matches_llama_cpp_pythons_own_generate(backend: Any, prompt: list[int]) -> None:
    from pytest_kvaudit.core.runtime.decoder import Decoder

    dec = Decoder(backend)
    state = backend.fresh()
    logits = dec.step(prompt, state)
    ours = [int(logits.argmax())] + greedy(dec, state, int(logits.argmax()), 23)
    backend.llm.reset()
    theirs: list[int] = []
    for tok in backend.llm.generate(prompt, temp=0.0, top_k=1, reset=True):
        theirs.append(int(tok))
        if len(theirs) == len(ours) or tok in backend.eos_ids:
            break
    assert ours[: len(theirs)] == theirs and len(theirs) >= 8, (backend.decode(ours), backend.decode(theirs))


def test_warm_hits_the_engines_prompt_cache(backend: Any, prompt: list[int]) -> None:
    from pytest_kvaudit.core.runtime.decoder import Decoder

    dec = Decoder(backend)
    ids = prompt + backend.encode(" 12 + 7", )[:3]
    state, reused = dec.construct("warm", ids, len(prompt), None)
    assert reused == len(prompt) > 0  # the second request evaluated only what the first had not
    assert dec.cost.forward_tokens == len(ids) and state.n_past == len(ids)
    later, _ = dec.construct("warm", ids, len(prompt), None)
    assert kv.fingerprint(later) and later is not state
    with pytest.raises(UnsupportedCacheError, match="taken by a later request"):
        kv.fingerprint(state)  # the engine's context was lent to the later request: never read stale


def test_restore_is_bit_exact_with_live(backend: Any, prompt: list[int]) -> None:
    from pytest_kvaudit.core.runtime.decoder import Decoder

    dec = Decoder(backend)
    live = dec.build_state(prompt, [len(prompt)])
    restored, reused = dec.construct("restore", prompt, len(prompt), live)
    assert reused is None and dec.cost.forward_tokens == len(prompt)  # loaded, no forward
    assert restored.state_bytes() == live.state_bytes() and kv.equal(restored, live)
    assert greedy(dec, restored, 28, 12) == greedy(dec, live, 28, 12)


def test_transplants_move_the_whole_state_or_nothing(backend: Any, prompt: list[int]) -> None:
    from pytest_kvaudit.core.runtime.decoder import Decoder

    dec = Decoder(backend)
    a = dec.build_state(prompt, [len(prompt)])
    b = dec.build_state(prompt[:-1] + [28], [len(prompt)])  # a different last token: a different state
    assert not kv.equal(a, b)
    (row,) = kv.compare(a, b)
    assert row.parts[0].first is not None and row.kind == "whole(llama.cpp)"
    sham = kv.transplant(a, a)
    assert kv.equal(sham, a) and greedy(dec, sham, 28, 12) == greedy(dec, kv.clone(a), 28, 12)
    moved = kv.transplant(a, b)
    assert moved.state_bytes() == b.state_bytes() and a.state_bytes() != b.state_bytes()
    for layers, parts in (((3,), "kv"), (None, "k")):
        with pytest.raises(UnsupportedCacheError, match="llama.cpp backend keeps its state whole"):
            kv.transplant(a, b, layers, parts)


def test_extra_buffer_types_are_off_unless_asked(gguf: Path, prompt: list[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """By default the weights load into plain CPU buffers (ggml's own kernels: the way round the AMX int8 crash
    of a GCC 12 build, where a batch of 2+ tokens dies) and the report says so; KVAUDIT_LLAMACPP_EXTRA_BUFTS=1
    reaches the model load as llama.cpp's own default."""
    from pytest_kvaudit.core.runtime.backends import open_backend

    monkeypatch.delenv("KVAUDIT_LLAMACPP_EXTRA_BUFTS", raising=False)
    off = open_backend("llama.cpp", str(gguf), "fp32")
    assert off.llm.model_params.use_extra_bufts is False and off.environment["use_extra_bufts"] is False
    off.step(prompt, off.fresh())  # a many-token batch: the AMX int8 kernel's path where extra buffers are on
    monkeypatch.setenv("KVAUDIT_LLAMACPP_EXTRA_BUFTS", "1")
    on = open_backend("llama.cpp", str(gguf), "fp32")  # loaded only: on an affected machine a decode would crash
    assert on.llm.model_params.use_extra_bufts is True and on.environment["use_extra_bufts"] is True
    assert llama_cpp.llama_cpp.llama_model_default_params().use_extra_bufts is True  # the wrapper is gone


def test_a_q8_0_cache_runs_with_flash_attention(gguf: Path, prompt: list[int]) -> None:
    """llama.cpp creates no context with a quantized V cache unless flash attention is on (measured: 0.3.36
    raises "Failed to create llama_context"), so q8_0 switches it on and the report says so."""
    from pytest_kvaudit.core.runtime.backends import open_backend
    from pytest_kvaudit.core.runtime.decoder import Decoder

    b = open_backend("llama.cpp", str(gguf), "q8_0")
    assert b.environment["kv_cache_type"] == {"q8_0": "q8_0"} and b.environment["flash_attn"] == {"q8_0": True}
    live = Decoder(b).build_state(prompt, [len(prompt)])
    assert kv.clone(live).state_bytes() == live.state_bytes()


def test_a_short_audit_gives_every_claim_a_verdict(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                    gguf: Path) -> None:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)  # the built-in claims join, as in a user's run
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess(
        f"--kvaudit-model={gguf}", "--kvaudit-backend=llama.cpp", "--kvaudit-chat-template", "--kvaudit-n=2",
        "--kvaudit-max-new-tokens=16", f"--kvaudit-report={report}", "-p", "no:cacheprovider", "-W", "ignore")
    data = json.loads(report.read_text())
    assert sorted(data["claims"]) == sorted(CLAIMS), res.stdout.str()[-3000:]
    assert all(c["status"] in ("pass", "fail", "inconclusive") for c in data["claims"].values())
    assert data["environment"]["backend"] == "llama.cpp" and "layer sweep" in data["environment"]["not_available"]
    warm = [r for r in data["analyses"]["axes"] if r["construction"] == "warm"]
    assert warm and all(r["reused_tokens"] > 0 and r["warm_cold"] == 0 for r in warm)
    assert {r["construction"] for r in data["analyses"]["axes"]} >= {"prefill", "incremental", "warm", "restore"}
    res.stdout.fnmatch_lines(["*backend llama.cpp (llama-cpp-python *), K/V cache bf16 bf16, fp32 f32*"])
