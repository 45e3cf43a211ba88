"""The model backend is a seam: a backend registered by name runs every cell, probe and plan through its
``step``/``fresh``/``step_batch``, and an unknown name is a usage error listing the known ones (a registered engine
running a whole audit: tests/plugin/test_engine_plugin.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtest import run, setup_suite
from pytest_kvaudit.core.engine import EngineSpec
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.engines import check, known, register_backend
from pytest_kvaudit.core.runtime.backends import open_backend


def test_backends_are_chosen_by_name() -> None:
    assert "transformers" in known()
    with pytest.raises(KvauditError, match="not a known backend: use .*transformers"):
        check("vllm-but-misspelt")


def test_an_unknown_backend_is_a_usage_error(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, _ = run(pytester, tiny_llama, "--kvaudit-backend=nope")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*--kvaudit-backend='nope' is not a known backend: use *transformers*"])


def test_the_transformers_backend_loads_with_identity(tiny_llama: Path) -> None:
    b = open_backend("transformers", str(tiny_llama), "fp32", "cpu")
    assert b.identity["weights_digest"].startswith("sha256:") and b.shape()["layers"] == 2
    state = b.fresh()
    logits = b.step(b.encode("1+2=")[:3], state)
    assert logits.shape[-1] == b.vocab_size and b.decode([0]) == b.tokenizer.decode([0], skip_special_tokens=False)
    from pytest_kvaudit.engines.transformers.backend import open_spec

    register_backend(EngineSpec("twin", open_spec))
    assert open_backend("twin", str(tiny_llama), "fp32", "cpu").identity == b.identity


def test_the_llama_cpp_backend_without_its_engine_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chosen by name and imported only then: without llama-cpp-python it says how to install it, in one line."""
    import sys

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # an import of it raises ImportError
    assert "llama.cpp" in known()
    with pytest.raises(KvauditError, match=r"^--kvaudit-backend=llama.cpp needs llama-cpp-python: "
                                           r"pip install 'pytest-kvaudit\[llamacpp\]'$"):
        open_backend("llama.cpp", "model.gguf", "fp32")


def test_a_backends_own_constructions_join_only_its_cells() -> None:
    """warm and restore run under llama.cpp only: transformers' cells (and figures) are what they were, and
    restore, loaded rather than computed, is priced as its continuation alone."""
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.core.model.pipeline import constructions, step_named

    names = lambda backend: [s.name for s in constructions(AuditConfig(backend=backend))]  # noqa: E731
    assert "warm" not in names("transformers") and "restore" not in names("transformers")
    assert names("llama.cpp")[-2:] == ["warm", "restore"]
    assert step_named("restore").price(10, 20, 5) == (5, 5)
    assert step_named("warm").price(10, 20, 5) == (2 + 5, 20 + 5)
    # a whole-state engine has no layer sweep and no batch probe: neither run nor priced
    assert (AuditConfig(backend="llama.cpp").sweep_units, AuditConfig(backend="llama.cpp").batch_units) == (0, 0)
    assert (AuditConfig().sweep_units, AuditConfig().batch_units) == (8, 8)
