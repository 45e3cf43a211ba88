"""Nondeterminism is a finding, not a refusal: a model whose forward adds noise (what nondeterministic GPU
kernels do, more gently) is not refused as "not causal"; the run goes on and its replicas fail, named."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_bad_input import FakeLM
from test_bad_input import tiny_bert as tiny_bert  # noqa: F401 (the fixture, for this module)

from kvtest import LOW_BARS, setup_suite
from pytest_kvaudit.core.errors import KvauditError

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class Noisy:
    """``model`` with fresh random noise of ``scale`` on its logits at every call, and optionally a
    deterministic ``leak`` from the last token into every earlier position (a weakly bidirectional model)."""

    def __init__(self, model: Any, scale: float, leak: float = 0.0) -> None:
        self.model, self.scale, self.leak = model, scale, leak
        self.dtype, self.device = model.dtype, model.device

    def get_input_embeddings(self) -> Any:
        return self.model.get_input_embeddings()

    def __call__(self, input_ids: Any, use_cache: bool = False) -> Any:
        import torch

        logits = self.model(input_ids=input_ids, use_cache=use_cache).logits
        logits = logits + self.scale * torch.randn(logits.shape, dtype=logits.dtype)
        return SimpleNamespace(logits=logits + self.leak * (input_ids[..., -1:, None] % 2).to(logits.dtype))


def load(ck: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(ck)).eval()


def test_a_noisy_causal_model_is_not_refused_and_its_spread_is_returned(tiny_llama: Path) -> None:
    from pytest_kvaudit.core.runtime.refusals import check_causal

    model = load(tiny_llama)
    assert check_causal(model, Path("plain")) == 0.0  # deterministic: the spread is nil
    # logits of scale ~0.3: noise of 1e-3 is far above rounding (the old rule refused it at 5e-7)
    spread = check_causal(Noisy(model, 1e-3), Path("noisy"))
    assert 1e-4 < spread < 1e-2
    check_causal(Noisy(FakeLM(future=False), 1e-3), Path("noisy stand-in"))
    # a leak within the noise cannot be told from it: not refused (the replicas will show the noise)
    check_causal(Noisy(FakeLM(future=False), 1e-3, leak=1e-6), Path("leak within noise"))


def test_a_model_that_sees_the_future_is_refused_through_the_noise(request: pytest.FixtureRequest) -> None:
    from pytest_kvaudit.core.runtime.refusals import check_causal

    # logits of scale ~20, earlier positions move by ~17 when the last token changes
    bert = load(request.getfixturevalue("tiny_bert"))
    with pytest.raises(KvauditError, match=r"is not causal: .* nondeterministic, and 4x that"):
        check_causal(Noisy(bert, 0.1), Path("noisy encoder"))
    with pytest.raises(KvauditError, match="nondeterministic, and 4x that"):
        check_causal(Noisy(FakeLM(future=True), 1e-3), Path("noisy stand-in encoder"))
    with pytest.raises(KvauditError, match="nondeterministic, and 4x that"):
        check_causal(Noisy(FakeLM(future=False), 1e-5, leak=1e-2), Path("leak above noise"))


#: a conftest that makes every attention call add fresh noise to its output, as nondeterministic kernels
#: do: the model is loaded and probed for causality with it, so the refusal check sees the noise too
NOISY_ATTENTION = """
import torch

_sdpa = torch.nn.functional.scaled_dot_product_attention

def noisy_sdpa(*args, **kwargs):
    out = _sdpa(*args, **kwargs)
    return out + 1e-2 * out.abs().max() * torch.randn(out.shape, dtype=out.dtype, device=out.device)

torch.nn.functional.scaled_dot_product_attention = noisy_sdpa
"""


def test_a_nondeterministic_model_fails_its_replicas_and_is_not_refused(pytester: pytest.Pytester,
                                                                        tiny_llama: Path) -> None:
    setup_suite(pytester, NOISY_ATTENTION, LOW_BARS)
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-attn=sdpa",
                                        f"--kvaudit-report={report}", "-p", "no:cacheprovider",
                                        "test_replica_exactness.py", "test_bridge_bitexact.py")
    res.stdout.no_fnmatch_line("*not causal*")
    res.assert_outcomes(failed=2)
    data = json.loads(report.read_text())
    rep, bridge = data["claims"]["replica_exactness"], data["claims"]["bridge_bitexact"]
    assert rep["status"] == "fail" and bridge["status"] == "fail"
    # the first differing replica is named: item, precision, construction and what differs first
    res.stdout.fnmatch_lines(["*replica_exactness FAILED: * replica(s) differ, the first t00@bf16/live*"])
    first = rep["details"][0]
    assert first["unit"] == "t00@bf16" and first["a"] == "live" and first["differs"]
