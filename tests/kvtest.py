"""What kvaudit's self-tests share: the repository's root, low evidence bars for 8-item runs, the claim suites
laid out as a user has them, a run through the plugin with its JSON report, and fault hooks that break one path
(importable from every test folder: pyproject puts ``tests/`` on the path)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

LOW_BARS = """
[pytest]
kvaudit_thresholds =
    replica_exactness.min_units=4
    matched_construction.min_units=4
    matched_construction.margin=1.0
    matched_construction.min_each=0
    fixed_prefix_2x2.max_rate=0.5
    fixed_prefix_2x2.min_recurring=1
    bridge_bitexact.min_units=4
    donor_following.min_units=1
"""


def faults(**hooks: str) -> str:
    """A conftest line that injects these faults (``logits=``, ``state=``, ``transplant=`` expressions)."""
    args = ", ".join(f"{k}={v}" for k, v in hooks.items())
    return f"def pytest_kvaudit_faults(config):\n    return Faults({args})\n"


def setup_suite(pytester: pytest.Pytester, conftest: str = "", ini: str = LOW_BARS) -> None:
    """The claim suites as a user has them (the ledger audit has its own tests in test_ledger.py)."""
    for f in (REPO / "suites").glob("test_*.py"):
        if f.name != "test_ledger_audit.py":
            shutil.copy(f, pytester.path / f.name)
    pytester.makeini(ini)
    if conftest:
        pytester.makeconftest(conftest)


def run(pytester: pytest.Pytester, ckpt: Path, *args: str) -> tuple[pytest.RunResult, dict]:
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ckpt}", "--kvaudit-n=8", f"--kvaudit-report={report}",
                                        "-p", "no:cacheprovider", "-rs", *args)
    data = json.loads(report.read_text()) if report.exists() else {}
    return res, data


def flat(text: str) -> str:
    """A run's terminal output with the claims table's wrapped detail lines joined (a word cut at its hyphen is
    made whole), so a test can look for a figure wherever the 120-column table wrapped it."""
    return re.sub(r"\s+", " ", re.sub(r"(?<=-)\n\s+", "", text))


def statuses(data: dict) -> dict[str, str]:
    return {k: v["status"] for k, v in data["claims"].items()}


BREAK = """
import torch
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.core.runtime.decoder import Faults

def noisy_logits(paths):
    def hook(logits, path):
        return logits + 1e-3 * torch.ones_like(logits) if path in paths else logits
    return hook

def noisy_state(paths, dtypes=None):
    def hook(cache, path):
        if path not in paths:
            return
        gen = torch.Generator().manual_seed(0)
        for k, v in kv.layer_kv(cache):
            if dtypes is None or str(k.dtype) in dtypes:
                k.add_(8 * torch.randn(k.shape, generator=gen).to(k.dtype))
                v.add_(8 * torch.randn(v.shape, generator=gen).to(v.dtype))
    return hook
"""


def script(name: str):  # noqa: ANN201
    """``scripts/NAME.py`` as a module, loaded once (the docs' tests read the pages through these scripts)."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]
