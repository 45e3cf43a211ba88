"""kvaudit's pytest hooks and fixtures, and nothing else.

pytest imports this module in every run of the venv kvaudit is installed in, so it imports what every run reads:
the options (:mod:`.options`), kvaudit's own hook, and where the process sits (:mod:`.xdist_glue`, the interrupt
handler). The session (:mod:`.session_open`: the config, the engine's record, the claims, the gate) opens at configure
when the run names a kvaudit option or ini key, and otherwise on the first sign that the run audits: a collected
test that reads a kvaudit fixture or is a ``kvaudit_claim``, or, on an xdist controller, which collects nothing, a
worker's verdict. A run that audits nothing reads no config and loads no engine; the store (torch, transformers)
loads in the ``kvaudit_store`` fixture the first time a claim needs it. ``tests/plugin/test_lean.py`` holds this.
"""

from __future__ import annotations

from pathlib import Path
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
    from pytest_kvaudit.session import KvauditSession

SESSION_KEY = pytest.StashKey["KvauditSession"]()
#: a run that named no kvaudit option: where its process sits, settled at configure, until it audits
PLACE_KEY = pytest.StashKey[tuple[Topology, XdistController | None]]()
PLAN_SKIP = "kvaudit plan only (--kvaudit-plan): planned, not run"
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
        from pytest_kvaudit.session_open import open_session

        open_session(config, SESSION_KEY)
        return
    topo = Topology()
    config.stash[PLACE_KEY] = (topo, place(config, topo))
    config.pluginmanager.register(_Asleep(config), "kvaudit-asleep")


def _session(config: pytest.Config) -> KvauditSession | None:
    """The run's session; None while a run that named no kvaudit option has not audited (yet)."""
    return config.stash.get(SESSION_KEY, None)


def _wake(config: pytest.Config) -> KvauditSession:
    """The run's session, opened now in a run that named no kvaudit option and turns out to audit (its options
    are the defaults: nothing to refuse)."""
    sess = _session(config)
    if sess is None:
        from pytest_kvaudit.session_open import open_session

        sess = open_session(config, SESSION_KEY, config.stash[PLACE_KEY])
    return sess


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
        if _session(self.config) is None and any(str(k).startswith("kvaudit_") for k, _ in report.user_properties):
            _wake(self.config).pytest_runtest_logreport(report)  # registered now: this report reaches it here


def _claim_name(item: pytest.Item) -> str | None:
    m = item.get_closest_marker("kvaudit_claim")
    return str(m.args[0]) if m is not None and m.args else None


@pytest.hookimpl
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each claim once: a built-in claim that a collected file already holds (a clone's suites/, a copy) is
    dropped; ``--kvaudit-claims`` picks among the built-in ones. A run that named no kvaudit option audits from
    here on if it collected a kvaudit test; else it is left alone."""
    sess = _session(config)
    if sess is None:
        if not any(map(_is_kvaudit_test, items)):
            return
        sess = _wake(config)
    from pytest_kvaudit import gate
    from pytest_kvaudit.core.model.config import SUITES_DIR
    from pytest_kvaudit.selection import uses_store

    sel = sess.selection.asked
    seen: set[str] = set()
    keep, drop = [], []
    for item in items:
        name = _claim_name(item)
        builtin = Path(str(item.path)).parent == SUITES_DIR
        if name is not None and (name in seen or (builtin and sel is not None and sel != ("all",) and name not in sel)):
            drop.append(item)
            continue
        if name is not None:
            seen.add(name)
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    if sess.gate is not None and not sess.settings.plan_only:
        gate.add_item(session, items, sess.gate, sess.get_store)
    if sess.settings.plan_only:  # the plan prices the run; no claim computes anything
        for item in filter(uses_store, items):
            item.add_marker(pytest.mark.skip(reason=PLAN_SKIP))


@pytest.hookimpl
def pytest_report_header(config: pytest.Config) -> list[str]:
    """The run's model, precisions, device and seed, in a run that names a kvaudit option (one that names none
    and turns out to audit says them in its report)."""
    if (sess := _session(config)) is None:
        return []
    from pytest_kvaudit.core.runtime.chat import checkpoint_source, header_line

    c = sess.config
    return [
        f"kvaudit: model={c.model} dtypes={','.join(c.dtypes)} device={c.device} "
        f"attn={c.attn or 'checkpoint default'} seed={c.seed}",
        f"kvaudit: {header_line(c.chat_template, checkpoint_source(c.model))}",
        *([f"kvaudit: replicas and the bridge on the first {c.exact_items} items of the set (--kvaudit-exact-items); "
           "every other claim reads every item"] if c.exact_items is not None else []),
    ]


# -- fixtures -------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def kvaudit_session(pytestconfig: pytest.Config) -> KvauditSession:
    return _wake(pytestconfig)  # open already, unless a test asked for a kvaudit fixture by name at run time


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
    from pytest_kvaudit.judge import Judge

    return Judge(kvaudit_session, request.node, kvaudit_store)  # type: ignore[arg-type]


@pytest.hookimpl
def pytest_collection_finish(session: pytest.Session) -> None:
    if (sess := _session(session.config)) is not None:
        from pytest_kvaudit import thresholds

        thresholds.at_collection(sess)


# -- the report -----------------------------------------------------------------------------------
@pytest.hookimpl
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or (sess := _session(config)) is None:
        return
    from pytest_kvaudit.report.comparison import compare_lines
    from pytest_kvaudit.report.terminal import lines, plan_lines
    from pytest_kvaudit.report.writers import report_path
    from pytest_kvaudit.session_report import run_report

    said = sess.verdicts
    for note in said.notes:
        terminalreporter.write_line(f"kvaudit: {note}", yellow=True)
    if said.plan is not None:
        terminalreporter.write_sep("=", "kvaudit plan (nothing computed beyond the calibration)")
        for line in plan_lines(said.plan):
            terminalreporter.write_line(line)
    if said.strict_line is not None:
        terminalreporter.write_line(f"kvaudit: FAILED: {said.strict_line}", red=True)
    if said.shard_line is not None:
        bad = said.shard_line.startswith("FAILED")
        terminalreporter.write_line(f"kvaudit: {said.shard_line}", red=bad, green=not bad)
    if said.interrupted:
        terminalreporter.write_line("kvaudit: interrupted: no claim judged on the whole run, no report written",
                                    yellow=True)
        return
    rep = said.report if said.report is not None else run_report(sess)
    if rep is None:
        if sess.run.error:
            terminalreporter.write_sep("=", "kvaudit")
            terminalreporter.write_line(f"kvaudit could not run: {sess.run.error}")
        return
    terminalreporter.write_sep("=", "kvaudit claims")
    for line in lines(rep):
        terminalreporter.write_line(line)
    if "baseline" in rep:
        terminalreporter.write_sep("-", f"kvaudit: changes from the baseline {rep['baseline']['path']}")
        for line in compare_lines(rep["baseline"]):
            terminalreporter.write_line(line, red=line.startswith("REGRESSION"), green=line.startswith("improvement"))
    if (path := report_path(sess.settings.outputs)) is not None:
        terminalreporter.write_line(f"report written to {path}")


@pytest.hookimpl
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput") or (sess := _session(config)) is None:
        return
    from pytest_kvaudit import thresholds
    from pytest_kvaudit.core.atomic import atomic_write_text
    from pytest_kvaudit.core.cost.ledger import snapshot_folder
    from pytest_kvaudit.report.document import dumps
    from pytest_kvaudit.report.writers import WRITERS
    from pytest_kvaudit.session_report import run_report

    if sess.controller is not None:  # the workers' selection: the plan and the estimate are for its work
        sess.adopt(sess.controller.selection)
    if sess.settings.plan_only:
        _plan_only(session, sess)
        return
    said, run = sess.verdicts, sess.run
    if run.topology.shard is not None and not config.option.collectonly:
        # a shard run succeeds only when its partial is written: the skipped claims alone would exit 0
        ctl = sess.controller
        said.shard_line = run.finish_shard(ctl.dir if ctl else None, ctl.workers if ctl else 0, run.error)
        if said.shard_line.startswith("FAILED") and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    if session.exitstatus == pytest.ExitCode.INTERRUPTED:
        said.interrupted = True  # the claims judged so far are not the run's verdict: no report claims they are
        return
    thresholds.gate_unread(session, sess)
    rep = said.report = run_report(sess)
    if rep is None:
        return
    outputs = sess.settings.outputs
    sections = {n: d.get("html") for n, d in said.display.items() if "html" in d}
    for writer in WRITERS:
        if writer.flag in outputs:
            writer.write(rep, outputs[writer.flag], sections)
    if config.getoption("update_snapshots", False) and any(c.figures.get("recorded") is True
                                                            for c in said.claims.values()):
        # the run's verdicts beside the ledger it recorded: what --kvaudit-baseline compares the next checkpoint
        # with (a refused recording leaves both as they were)
        cfg = sess.config
        path = snapshot_folder(cfg.snapshots or config.rootpath / "snapshots", cfg.model) / "report.json"
        atomic_write_text(path, dumps({k: v for k, v in rep.items() if k != "baseline"}))


def _plan_only(session: pytest.Session, sess: KvauditSession) -> None:
    """--kvaudit-plan: price the run when it holds a kvaudit test (under xdist the controller sees the skips)."""
    stats = getattr(session.config.pluginmanager.get_plugin("terminalreporter"), "stats", {})
    if not any(PLAN_SKIP in str(getattr(r, "longrepr", "")) for r in stats.get("skipped", [])):
        return
    sess.plan_run(int(getattr(session.config.option, "numprocesses", 0) or 1))
    if sess.run.error is not None:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

