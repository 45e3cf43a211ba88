"""GGUF checkpoints: a .gguf file (or a folder of one) loads dequantized at each precision, its identity
digests the file and names the quantization, and a missing [gguf] extra is one line."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.runtime import gguf
from pytest_kvaudit.core.runtime.loading import model_identity, open_model, resolve_checkpoint


def test_a_gguf_file_or_its_folder_is_a_checkpoint(smollm2: tuple[Path, Path], tmp_path: Path) -> None:
    file, _ = smollm2
    assert resolve_checkpoint(str(file)) == file.resolve() and gguf.gguf_file(file) == file
    assert gguf.gguf_file(file.parent) == file  # the cache folder holds one .gguf and no config.json
    ident = model_identity(str(file), file)
    assert ident["gguf"] == {"file": file.name, "quantization": "Q4_1", "dequantized": True,
                             "tensor_types": {"F32": 61, "Q4_1": 210, "Q8_0": 1}}
    assert ident["architecture"] == "LlamaForCausalLM" and ident["num_layers"] == 30
    assert ident["weights_digest"].startswith("sha256:")
    assert model_identity("x", file.parent)["weights_digest"] == ident["weights_digest"]
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"GGUF")
    with pytest.raises(KvauditError,
                       match=r"holds 2 GGUF files \(a.gguf, b.gguf\): pass one as --kvaudit-model=FILE.gguf"):
        gguf.gguf_file(two)


def test_loads_dequantized_and_equals_its_conversion(smollm2: tuple[Path, Path]) -> None:
    """fp32 from the GGUF gives the converted checkpoint's weights and logits bit for bit; the tokenizer and
    chat template come from the file."""
    import torch

    file, ckpt = smollm2
    g = open_model(OpenSpec(str(file), "fp32", "cpu"))
    assert g.model.dtype == torch.float32 and not getattr(g.model, "is_quantized", False)
    assert g.tokenizer.chat_template and g.eos_ids == frozenset({2}) and g.vocab_size == 49152
    c = open_model(OpenSpec(str(ckpt), "fp32", "cpu"))
    ids = torch.tensor([g.tokenizer("Compute 17 + 26 + 38.")["input_ids"]])
    assert ids.tolist()[0] == c.tokenizer("Compute 17 + 26 + 38.")["input_ids"]
    assert torch.equal(g.model(ids).logits, c.model(ids).logits)


def test_a_missing_extra_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF")
    with pytest.raises(KvauditError) as exc:
        model_identity(str(f), resolve_checkpoint(str(f)))
    assert str(exc.value) == (f"checkpoint {f} is a GGUF file: install pytest-kvaudit[gguf] (gguf and accelerate) "
                              "to load it (missing: gguf)")


def test_a_damaged_gguf_is_one_line(tmp_path: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        pytest.skip("the gguf package (pytest-kvaudit[gguf]) is not installed")
    f = tmp_path / "cut.gguf"
    f.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\x00" * 7)
    with pytest.raises(KvauditError, match=r"is not a readable GGUF file .*re-download it") as exc:
        model_identity(str(f), f)
    assert "\n" not in str(exc.value)


def test_another_file_is_still_refused(tmp_path: Path) -> None:
    f = tmp_path / "model.safetensors"
    shutil.copy(__file__, f)
    with pytest.raises(KvauditError,
                       match="is a file, not a directory: pass the folder holding config.json, or a .gguf file"):
        resolve_checkpoint(str(f))
