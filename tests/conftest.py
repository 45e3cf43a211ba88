"""Shared fixtures for kvaudit's self-tests: tiny random checkpoints built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_kvaudit.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama", n_items=14)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_kvaudit.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", n_items=14)
