"""kvaudit's pytest hooks and fixtures, and nothing else.

pytest imports this module in every run of the venv kvaudit is installed in, so it imports what every run reads:
the options (:mod:`.options`), kvaudit's own hook, and where the process sits (:mod:`.xdist_glue`, the interrupt
handler). The session (:mod:`.run_hooks`: the config, the engine's record, the claims, the gate) opens at configure
when the run names a kvaudit option or ini key, and otherwise on the first sign that the run audits: a collected
test that reads a kvaudit fixture or is a ``kvaudit_claim``, or, on an xdist controller, which collects nothing, a
worker's verdict. A run that audits nothing reads no config and loads no engine; the store (torch, transformers)
loads in the ``kvaudit_store`` fixture the first time a claim needs it. ``tests/plugin/test_lean.py`` holds this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import hooks
from pytest_kvaudit import options as opt
from pytest_kvaudit.workers.topology import Topology
from pytest_kvaudit.xdist_glue import XdistController, place

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.judge import Judge
    from pytest_kvaudit.run_hooks import RunHooks
    from pytest_kvaudit.session import KvauditSession

RUN_KEY = pytest.StashKey["RunHooks"]()
#: a run that named no kvaudit option: where its process sits, settled at configure, until it audits
PLACE_KEY = pytest.StashKey[tuple[Topology, XdistController | None]]()
#: the fixtures that make a collected test a kvaudit test (with the ``kvaudit_claim`` marker)
FIXTURES = frozenset({"kvaudit_session", "kvaudit_config", "kvaudit_store", "kvaudit_records", "kvaudit_judge"})

# the option names, importable from here as before
MODEL, DTYPES, REPORT, HTML, BASELINE = opt.MODEL, opt.DTYPES, opt.REPORT, opt.HTML, opt.BASELINE


@pytest.hookimpl
def pytest_addoption(parser: pytest.Parser) -> None:
    opt.add_options(parser)


@pytest.hookimpl
def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hooks)


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvaudit_claim(name, **thresholds): a kvaudit claim test and its threshold overrides"
    )
    if opt.asked(config):  # every value checked now, before anything runs
        _open(config, None)
        return
    topo = Topology()
    config.stash[PLACE_KEY] = (topo, place(config, topo))
    config.pluginmanager.register(_Asleep(config), "kvaudit-asleep")


def _open(config: pytest.Config, placed: tuple[Topology, XdistController | None] | None) -> RunHooks:
    # the one import of the audit's modules (config, engine records, claims, report): the run audits from here on
    from pytest_kvaudit.run_hooks import open_run

    run = config.stash[RUN_KEY] = open_run(config, placed)
    return run


def _run(config: pytest.Config) -> RunHooks | None:
    """The run's hooks; None while a run that named no kvaudit option has not audited (yet)."""
    return config.stash.get(RUN_KEY, None)


def _wake(config: pytest.Config) -> RunHooks:
    """The run's hooks, opened now in a run that named no kvaudit option and turns out to audit (its options are
    the defaults: nothing to refuse)."""
    return _run(config) or _open(config, config.stash[PLACE_KEY])


def _is_kvaudit_test(item: pytest.Item) -> bool:
    return item.get_closest_marker("kvaudit_claim") is not None or not FIXTURES.isdisjoint(
        getattr(item, "fixturenames", ()))


class _Asleep:
    """In a run that named no kvaudit option: an xdist controller collects nothing, so it learns that the run
    audits from the first worker report that carries a verdict (:mod:`.verdict_relay`'s ``kvaudit_*``
    properties), and opens the session then, to judge and report as it would have."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if _run(self.config) is None and any(str(k).startswith("kvaudit_") for k, _ in report.user_properties):
            _wake(self.config).session.pytest_runtest_logreport(report)  # registered now: give it this one


@pytest.hookimpl
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each claim once (:meth:`.run_hooks.RunHooks.modify_items`). A run that named no kvaudit option audits from
    here on if it collected a kvaudit test; else it is left alone."""
    run = _run(config)
    if run is None:
        if not any(map(_is_kvaudit_test, items)):
            return
        run = _wake(config)
    run.modify_items(session, items)


@pytest.hookimpl
def pytest_report_header(config: pytest.Config) -> list[str]:
    """The run's model, precisions, device and seed, in a run that names a kvaudit option (one that names none and
    turns out to audit says them in its report)."""
    return [] if (run := _run(config)) is None else run.header()


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kvaudit_session(pytestconfig: pytest.Config) -> KvauditSession:
    return _wake(pytestconfig).session  # open already, unless a test asked for a kvaudit fixture at run time


@pytest.fixture(scope="session")
def kvaudit_config(kvaudit_session: KvauditSession) -> AuditConfig:
    """The run's AuditConfig (model, precisions, items, ...)."""
    return kvaudit_session.config


@pytest.fixture(scope="session")
def kvaudit_store(kvaudit_session: KvauditSession) -> Store:
    """The compute-once store: every cell of the run, computed on first use, read by every claim."""
    return kvaudit_session.get_store()


@pytest.fixture(scope="session")
def kvaudit_records(kvaudit_store: Store) -> list[Any]:
    """Every (item, precision) record of the run, in item order."""
    return list(kvaudit_store.records.values())


@pytest.fixture
def kvaudit_judge(request: pytest.FixtureRequest, kvaudit_session: KvauditSession, kvaudit_store: Store) -> Judge:
    """Judge a claim: ``kvaudit_judge.claim()``, ``kvaudit_judge.exact(name, units)``, ``.verdict(result)``."""
    return _wake(request.config).judge(request.node, kvaudit_store)  # type: ignore[arg-type]


@pytest.hookimpl
def pytest_collection_finish(session: pytest.Session) -> None:
    if (run := _run(session.config)) is not None:
        run.collection_finish()


# -- the report -----------------------------------------------------------------------------------
@pytest.hookimpl
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not hasattr(config, "workerinput") and (run := _run(config)) is not None:
        run.terminal_summary(terminalreporter)


@pytest.hookimpl
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not hasattr(session.config, "workerinput") and (run := _run(session.config)) is not None:
        run.session_finish(session)
