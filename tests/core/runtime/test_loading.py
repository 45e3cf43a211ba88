"""Loading: safe by default, and every failure is one line naming the checkpoint and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.runtime.loading import model_identity, open_model, resolve_checkpoint


def one_line(exc: pytest.ExceptionInfo[KvauditError]) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(KvauditError) as exc:
        resolve_checkpoint(str(tmp_path / "nowhere"))
    assert "does not exist" in one_line(exc) and "--kvaudit-model" in one_line(exc)


def test_hub_id_without_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(KvauditError) as exc:
        resolve_checkpoint("no-such-org/no-such-model")
    assert "cannot fetch hub model 'no-such-org/no-such-model'" in one_line(exc)


def test_pickle_only_checkpoint_is_refused(tmp_path: Path) -> None:
    from pytest_kvaudit.testing import tiny_checkpoint

    ck = tiny_checkpoint(tmp_path / "pk", "llama", safetensors=False)
    assert not list(ck.glob("*.safetensors"))
    with pytest.raises(KvauditError) as exc:
        open_model(OpenSpec(str(ck), "fp32", "cpu"))
    msg = one_line(exc)
    assert "only pickle weights" in msg and "--kvaudit-allow-pickle" in msg
    h = open_model(OpenSpec(str(ck), "fp32", "cpu", allow_pickle=True))
    assert h.identity["architecture"] == "LlamaForCausalLM"


def test_remote_code_needs_opt_in(tiny_llama: Path, tmp_path: Path) -> None:
    ck = tmp_path / "remote"
    shutil.copytree(tiny_llama, ck)
    cfg = json.loads((ck / "config.json").read_text())
    cfg["model_type"] = "my_custom_arch"
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_custom.CustomLM"}
    (ck / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(KvauditError) as exc:
        open_model(OpenSpec(str(ck), "fp32", "cpu"))
    assert "needs custom code" in one_line(exc) and "--kvaudit-trust-remote-code" in one_line(exc)


def test_vocab_mismatch(tiny_llama: Path, tmp_path: Path) -> None:
    from pytest_kvaudit.testing import tiny_checkpoint

    ck = tiny_checkpoint(tmp_path / "small", "llama")
    cfg = json.loads((ck / "config.json").read_text())
    # a tokenizer from a bigger vocabulary than the model's embedding
    tok = json.loads((ck / "tokenizer.json").read_text())
    for i in range(5):
        tok["model"]["vocab"][f"x{i}"] = cfg["vocab_size"] + i
    (ck / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(KvauditError) as exc:
        open_model(OpenSpec(str(ck), "fp32", "cpu"))
    assert "different checkpoints" in one_line(exc)


def test_identity_digests_weight_bytes(tiny_llama: Path, tmp_path: Path) -> None:
    a = model_identity("x", tiny_llama)
    assert a["architecture"] == "LlamaForCausalLM" and a["num_layers"] == 2
    ck = tmp_path / "copy"
    shutil.copytree(tiny_llama, ck)
    assert model_identity("x", ck)["weights_digest"] == a["weights_digest"]
    w = next(ck.glob("*.safetensors"))
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert model_identity("x", ck)["weights_digest"] != a["weights_digest"]


def test_unknown_device_and_dtype() -> None:
    from pytest_kvaudit.core.model.config import parse_device, parse_dtypes

    with pytest.raises(KvauditError, match="not auto, cpu, cuda or cuda:N"):
        parse_device("tpu")
    with pytest.raises(KvauditError, match="unknown precision 'fp8'"):
        parse_dtypes("bf16,fp8")
    assert parse_dtypes("bfloat16, fp32,bf16") == ("bf16", "fp32")


def test_cuda_requested_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pytest_kvaudit.core.runtime.loading import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KvauditError, match="sees no CUDA device"):
        resolve_device("cuda:0")
    assert resolve_device("auto") in ("cpu", "mps")


def test_a_gpu_without_bf16_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pytest_kvaudit.core.runtime.loading import check_dtype_supported

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "Tesla V100")
    with pytest.raises(KvauditError, match=r"^Tesla V100 does not support bf16: use --kvaudit-dtypes=fp16,fp32$"):
        check_dtype_supported("bf16", "cuda:0")


def test_a_device_that_cannot_run_a_dtype_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pytest_kvaudit.core.runtime.loading import check_dtype_supported

    real_ones = torch.ones

    def ones(*a: object, **k: object) -> object:
        if k.get("dtype") is torch.float16:
            raise RuntimeError('"addmm_impl_cpu_" not implemented for \'Half\'')
        return real_ones(*a, **k)

    monkeypatch.setattr(torch, "ones", ones)
    with pytest.raises(KvauditError, match=r"device cpu cannot run fp16 matmuls .*drop it from --kvaudit-dtypes"):
        check_dtype_supported("fp16", "cpu")
    check_dtype_supported("fp32", "cpu")


def test_xdist_worker_i_takes_gpu_i_mod_the_gpu_count(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import torch

    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.core.runtime.torch_settings import prepare
    from pytest_kvaudit.workers.lifecycle import Lifecycle
    from pytest_kvaudit.workers.topology import Topology

    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(Store, "open", classmethod(lambda cls, cfg, *a: seen.append(cfg.device)))
    for index in range(3):
        Lifecycle(AuditConfig(), Topology(worker=(index, 3, tmp_path))).open()
    assert seen == ["cuda:0", "cuda:1", "cuda:0"]
    # one process alone keeps the device it was given; a device_map spreads one model and is left alone
    assert prepare(AuditConfig(device="auto")).device == "auto"
    assert prepare(AuditConfig(device_map="auto"), 1).device == "auto"
    torch.set_num_threads(1)


def test_xdist_shards_from_two_environments_are_refused() -> None:
    from pytest_kvaudit.workers.merge import check_one_environment

    def export(gpu: str, digest: str = "sha256:a") -> dict:
        return {"records": [{}], "environment": {"device": "cuda", "device_name": gpu},
                "identity": {"weights_digest": digest}}

    check_one_environment([export("NVIDIA H200"), export("NVIDIA H200")])
    check_one_environment([export("NVIDIA H200"), {"records": [], "environment": {}, "identity": {}}])  # idle worker
    with pytest.raises(KvauditError, match=r"^xdist shards were computed in different environments "
                                           r"\(environment.device_name 'NVIDIA H200' vs 'NVIDIA A100'\)"):
        check_one_environment([export("NVIDIA H200"), export("NVIDIA A100")])
    with pytest.raises(KvauditError, match="model.weights_digest"):
        check_one_environment([export("NVIDIA H200"), export("NVIDIA H200", "sha256:b")])
