"""A pytest run that audits nothing pays almost nothing (issue 44, part 5): users install kvaudit into the venv where
their other tests run, so an unrelated run must not read kvaudit's config, load an engine's record, or import the
claims, torch or transformers, on any process. A run that names no kvaudit option still audits when it collects a
kvaudit test: its session opens then, with the defaults. The time this saves is measured, not asserted here:
``benchmarks/plugin_overhead.py``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

#: what a run that audits nothing may import of kvaudit, on every process: the plugin, its options, its own hook,
#: and where the process sits (the xdist glue and the interrupt handler; the controller's progress printer)
FRONT = frozenset({
    "pytest_kvaudit", "pytest_kvaudit.plugin", "pytest_kvaudit.options", "pytest_kvaudit.hooks",
    "pytest_kvaudit.core", "pytest_kvaudit.core.errors", "pytest_kvaudit.report",
    "pytest_kvaudit.report.writers", "pytest_kvaudit.xdist_glue", "pytest_kvaudit.interrupts",
    "pytest_kvaudit.selection", "pytest_kvaudit.workers", "pytest_kvaudit.workers.stop",
    "pytest_kvaudit.workers.topology",
    # the xdist controller's, in its hooks: the progress printer and the workers' selection key
    "pytest_kvaudit.progress", "pytest_kvaudit.settings", "pytest_kvaudit.core.atomic", "pytest_kvaudit.core.compute",
    "pytest_kvaudit.core.compute.progress",
})
HEAVY = ("torch", "transformers", "numpy", "scipy")

#: every process writes the modules it imported when its session ends (``PYTEST_XDIST_WORKER``: gw0, gw1)
SPY = """
import json, os, sys

def pytest_sessionfinish(session):
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (session.config.rootpath / f"modules-{name}.json").write_text(json.dumps(sorted(sys.modules)))
"""


def run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """pytest in ``folder`` as a user's project runs it: no kvaudit option (the self-tests' PYTEST_ADDOPTS names
    one), bytecode as it is."""
    # under ``pytest -n 2`` this test's own process is an xdist worker: its PYTEST_XDIST_* variables would name the
    # child's processes after it (the spy writes by PYTEST_XDIST_WORKER)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS" and not k.startswith("PYTEST_XDIST")}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", *args],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_unrelated_run_imports_no_config_engine_claims_or_torch(tmp_path: Path, workers: str) -> None:
    (tmp_path / "conftest.py").write_text(SPY)
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    res = run(tmp_path, "-n", workers)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "kvaudit:" not in res.stdout, res.stdout  # no header, no summary
    seen = {p.stem.removeprefix("modules-"): set(json.loads(p.read_text())) for p in tmp_path.glob("modules-*.json")}
    assert set(seen) == ({"main"} if workers == "0" else {"main", "gw0", "gw1"}), seen
    for process, modules in seen.items():
        assert "pytest_kvaudit.plugin" in modules, process  # the spy sees the plugin: it would see the rest
        heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
        assert not heavy, f"{process} imported {heavy[:5]}"
        extra = sorted(m for m in modules if m.startswith("pytest_kvaudit") and m not in FRONT)
        assert not extra, (f"{process} imported {extra} in a run that audits nothing: import it where the run audits "
                           "(pytest_kvaudit.session, a hook's body), not in the plugin's front")


def test_the_spy_sees_a_run_that_audits(tmp_path: Path) -> None:
    """The check above fails where a run loads the config and an engine's record: a run naming an option does."""
    (tmp_path / "conftest.py").write_text(SPY)
    (tmp_path / "test_plain.py").write_text("def test_one():\n    assert 1 + 1 == 2\n")
    res = run(tmp_path, "--kvaudit-seed=0")
    assert res.returncode == 0, res.stdout + res.stderr
    modules = set(json.loads((tmp_path / "modules-main.json").read_text()))
    assert {"pytest_kvaudit.session", "pytest_kvaudit.core.model.config"} <= modules
    assert any(m.startswith("pytest_kvaudit") and m not in FRONT and "engine" in m for m in modules)
    assert "kvaudit: model=" in res.stdout  # the header names the run's config


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_naming_no_option_audits_when_it_collects_a_kvaudit_test(tmp_path: Path, workers: str) -> None:
    """Its session opens at collection, with the defaults, on every process that collects it."""
    (tmp_path / "test_mine.py").write_text(
        "def test_defaults(kvaudit_config):\n"
        "    assert (kvaudit_config.dtypes, kvaudit_config.seed, kvaudit_config.backend) == "
        "(('bf16', 'fp32'), 0, 'transformers')\n"
        "def test_plain():\n    pass\n")
    res = run(tmp_path, "-n", workers)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout, res.stdout


#: a plugin that sets options after kvaudit's configure: the run named none then, so its session opens when it
#: collects a kvaudit test (a worker) or sees a verdict (the xdist controller), reading these
LATE = """
import pytest

@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    config.option.kvaudit_model, config.option.kvaudit_n = "embedded", "4"
    config.option.kvaudit_report = "r.json"
"""
CLAIM = "import pytest\n\n@pytest.mark.kvaudit_claim('replica_exactness')\ndef test_it(kvaudit_judge):\n" \
        "    kvaudit_judge.claim()\n"


@pytest.mark.slow
def test_a_session_opened_late_judges_and_reports_as_one_opened_at_configure(tmp_path: Path) -> None:
    """Under xdist, where it is most fragile: each worker opens it at collection, the controller on the verdict
    (a single process opens it at collection, as a worker does)."""
    reports = []
    for name, conftest, options in (("asked", "", ["--kvaudit-model=embedded", "--kvaudit-n=4",
                                                   "--kvaudit-report=r.json"]), ("late", LATE, [])):
        d = tmp_path / name
        d.mkdir()
        (d / "conftest.py").write_text(conftest)
        (d / "test_claim.py").write_text(CLAIM)
        res = run(d, "test_claim.py", "-n", "2", *options)  # its own path: the built-in claims stay out
        assert res.returncode == 0, res.stdout + res.stderr
        assert "kvaudit claims" in res.stdout and "report written to" in res.stdout, res.stdout
        reports.append(json.loads((d / "r.json").read_text()))
    asked, late = reports
    assert late["claims"]["replica_exactness"]["status"] == "pass"
    for key in ("claims", "items", "analyses", "config", "model"):
        assert late[key] == asked[key], key
    assert late["cost"]["forward_tokens"] == asked["cost"]["forward_tokens"]
