"""One record per engine, found by entry point, and one table per precision: what every other module reads
instead of keeping its own copy."""

from __future__ import annotations

from importlib import metadata

import pytest

from pytest_kvaudit.core.engine import EngineSpec
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model import engines
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.model.engines import engine, known, register_backend
from pytest_kvaudit.core.model.precisions import PRECISIONS, aliases, low_precision, named, parse_dtypes

BUILTIN = ("llama.cpp", "transformers", "vllm")


def _open(spec: OpenSpec) -> object:
    raise AssertionError("never opened here")


def test_the_builtin_engines_are_entry_points_like_any_plugins() -> None:
    declared = {ep.name: ep.value for ep in metadata.entry_points(group=engines.GROUP)}
    assert set(BUILTIN) <= set(declared), f"pip install --no-deps -e . after changing entry points: {declared}"
    assert set(BUILTIN) <= set(known())
    for name in BUILTIN:  # each entry point loads the record of its name, nothing hidden in a string here
        assert engine(name).name == name and declared[name].endswith(":" + name.upper().replace(".", "_"))


def test_the_records_hold_what_the_four_tables_held() -> None:
    """What _BACKENDS/_CONSTRUCTIONS/_LACKS, CELL_BUILDERS, CALIBRATORS and the duck-typed attributes said."""
    t, ll, v = engine("transformers"), engine("llama.cpp"), engine("vllm")
    assert (t.level, t.constructions, t.lacks) == ("forward", (), frozenset())
    assert (ll.level, ll.constructions) == ("forward", ("warm", "restore"))
    assert ll.lacks == {"per_layer", "layer_sweep", "batch_invariance"} and "q8_0" in ll.precisions
    assert (v.level, v.constructions_at(4)) == ("request", ("warm", "batched(4)"))
    assert v.lacks == {"layer_sweep", "batch_invariance"} and "q8_0" not in v.precisions
    assert type(v.cell_builder).__name__ == "type" and v.cell_builder.__name__ == "VllmCellBuilder"
    assert t.cell_builder is ll.cell_builder and t.calibrator is ll.calibrator is not v.calibrator
    assert ll.report_lines is not None and ll.report_lines({}) == [] and t.report_lines is None
    line = ll.report_lines({"llama_cpp_python": "0.3", "kv_cache_type": {"fp32": "f32"}, "not_available": ["x"]})
    assert line == ["backend llama.cpp (llama-cpp-python 0.3), K/V cache fp32 f32; not available: x"]


def test_a_record_that_cannot_run_is_refused_in_one_line() -> None:
    with pytest.raises(KvauditError, match="is request-level: give it its own cell_builder and calibrator"):
        EngineSpec("served", _open, level="request")
    with pytest.raises(KvauditError, match="lacks per_token is not one of"):
        EngineSpec("x", _open, lacks=frozenset({"per_token"}))
    with pytest.raises(KvauditError, match="unknown precision 'fp8'"):
        EngineSpec("x", _open, precisions=("fp8",))
    with pytest.raises(KvauditError, match="register_backend takes an EngineSpec, not str"):
        register_backend("pytest_kvaudit.engines.transformers.backend:open_spec")  # type: ignore[arg-type]
    with pytest.raises(KvauditError, match="not a known backend: use .*transformers"):
        engine("vllm-but-misspelt")


def test_a_registered_record_is_found_by_name_and_may_replace_an_entry_point() -> None:
    spec = register_backend(EngineSpec("a-test-engine", _open, constructions=("restore",),
                                       lacks=frozenset({"per_layer"})))
    try:
        assert engine("a-test-engine") is spec and "a-test-engine" in known()
        cfg = AuditConfig(backend="a-test-engine")  # the name resolved once, when the config is built
        assert cfg.engine is spec and cfg.engine.constructions == ("restore",) and "per_layer" in cfg.engine.lacks
        assert cfg.replace(backend="transformers").engine is engine("transformers")
        assert cfg.replace(n=3).engine is spec and cfg.work_identity()["backend"] == "a-test-engine"
    finally:
        engines._REGISTERED.pop("a-test-engine")


def test_a_record_fills_in_its_own_defaults_and_checks_its_settings() -> None:
    """A field left out is the forward-level part, filled in by the record (no call site has a default of its
    own); the engine args it takes are its own to say: none by default, any where it checks them itself."""
    from pytest_kvaudit.core.compute import probes
    from pytest_kvaudit.core.compute.cells import CellBuilder
    from pytest_kvaudit.core.planning.calibrate import forward_calibration
    from pytest_kvaudit.core.runtime import state

    r = EngineSpec("x", _open)
    assert (r.cell_builder, r.calibrator, r.state_reader, r.cache_probe) == (CellBuilder, forward_calibration, state,
                                                                           probes.cache_probe)
    assert r.check_settings(AuditConfig()) is None and r.check_engine_args((), "--kvaudit-engine-arg") == ()
    with pytest.raises(KvauditError, match=r"^--kvaudit-engine-arg page_size: the x backend takes no such setting "
                                           r"\(it takes: none\)$"):
        r.check_engine_args((("page_size", "16"),), "--kvaudit-engine-arg")
    keyed = EngineSpec("y", _open, engine_arg_keys=frozenset({"page_size", "num_blocks"}))
    assert keyed.check_engine_args((("page_size", "16"),), "f") == (("page_size", "16"),)
    with pytest.raises(KvauditError, match=r"takes no such setting \(it takes: num_blocks, page_size\)"):
        keyed.check_engine_args((("block_size", "16"),), "f")
    assert engine("vllm").engine_arg_keys is None  # any vllm.LLM argument: its own check reads them
    with pytest.raises(KvauditError, match="the y backend runs no kind beyond dynamic"):
        EngineSpec("y", _open, cache_kinds=()).check_cache_kinds(("static",))


def test_an_entry_point_that_is_not_a_record_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    ep = metadata.EntryPoint("odd", "pytest_kvaudit.core.model.precisions:PRECISIONS", engines.GROUP)
    monkeypatch.setattr(engines, "_entry_points", lambda: {"odd": ep})
    with pytest.raises(KvauditError, match="is not an EngineSpec named 'odd'"):
        engine("odd")


def test_each_precision_is_declared_once() -> None:
    assert [p.name for p in PRECISIONS] == ["bf16", "fp16", "fp32", "q8_0"]
    assert aliases()["bfloat16"] == "bf16" and aliases()["half"] == "fp16" and aliases()["float"] == "fp32"
    assert parse_dtypes("bfloat16, fp32,bf16") == ("bf16", "fp32") and parse_dtypes("Q8_0") == ("q8_0",)
    assert low_precision() == {"bf16", "fp16", "q8_0"}
    assert named("q8_0").nbytes(32) == 34 and named("bf16").nbytes(3) == 6 and named("fp32").nbytes(3) == 12
    with pytest.raises(KvauditError, match="unknown precision 'fp8'; use bf16, fp16, fp32, q8_0"):
        parse_dtypes("fp8")


def test_each_engine_names_the_precisions_of_the_one_table() -> None:
    """vLLM reads the shared table's torch names; llama.cpp's ggml cache types are its own (in its folder), one for
    each precision its record runs, every one a precision of the table."""
    from pytest_kvaudit.engines.llama_cpp.backend import KV_TYPES
    from pytest_kvaudit.engines.vllm.engine import DTYPES

    assert KV_TYPES == {"bf16": (30, "bf16"), "fp16": (1, "f16"), "fp32": (0, "f32"), "q8_0": (8, "q8_0")}
    assert engine("llama.cpp").precisions == tuple(KV_TYPES) and all(named(p).name == p for p in KV_TYPES)
    assert DTYPES == {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@pytest.mark.parametrize("dtype", [p.name for p in PRECISIONS])
def test_the_plan_prices_the_memory_of_every_precision(dtype: str) -> None:
    """The plan's memory block read a table of its own that lacked q8_0: a llama.cpp plan at q8_0 raised
    KeyError: 'q8_0' (reproduced on d44424a)."""
    from pytest_kvaudit.core.planning.plan import memory

    shape = {"layers": 2, "kv_heads": 2, "head_dim": 16, "parameters": 1000}
    m = memory(shape, 10, (dtype,), 1)
    assert m["bytes_per_cache"][dtype] == named(dtype).nbytes(2 * 2 * 16 * 2) * 10
    assert m["weights_bytes"][dtype] == named(dtype).nbytes(1000)


def test_an_install_without_the_entry_points_says_to_reinstall(monkeypatch: pytest.MonkeyPatch) -> None:
    """An editable install made before the engines became entry points lists none: the error says so, rather
    than 'use' followed by nothing."""
    monkeypatch.setattr(engines, "_REGISTERED", {})
    monkeypatch.setattr(engines, "_entry_points", dict)
    with pytest.raises(KvauditError,
                       match="no engine is registered under the 'kvaudit.engines' entry points; reinstall"):
        engines.check("transformers")
