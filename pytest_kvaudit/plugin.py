"""kvaudit's pytest hooks and fixtures, and nothing else.

Importing this module is cheap (no torch): options live in :mod:`.options`, the run's state in
:mod:`.session`, verdicts in :mod:`.judge`, and the store (with torch and transformers) loads in the
``kvaudit_store`` fixture the first time a claim needs it.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import gate, hooks, interrupts, thresholds
from pytest_kvaudit import options as opt
from pytest_kvaudit.claims import registered
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.cost.ledger import snapshot_folder
from pytest_kvaudit.core.model.config import SUITES_DIR, AuditConfig
from pytest_kvaudit.core.runtime.chat import checkpoint_source, header_line
from pytest_kvaudit.core.runtime.decoder import NO_FAULTS, Faults
from pytest_kvaudit.judge import Judge
from pytest_kvaudit.report.comparison import compare_lines
from pytest_kvaudit.report.document import dumps
from pytest_kvaudit.report.terminal import lines, plan_lines
from pytest_kvaudit.report.writers import WRITERS, report_path
from pytest_kvaudit.selection import uses_store
from pytest_kvaudit.session import KvauditSession
from pytest_kvaudit.session_report import run_report
from pytest_kvaudit.settings import Selection, Settings
from pytest_kvaudit.workers.lifecycle import Lifecycle
from pytest_kvaudit.workers.topology import Topology
from pytest_kvaudit.xdist_glue import XdistController, run_folder, worker_place

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.judge import Judge

SESSION_KEY = pytest.StashKey[KvauditSession]()
PLAN_SKIP = "kvaudit plan only (--kvaudit-plan): planned, not run"

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
    audit = opt.build_config(config)
    lines = thresholds.parse_thresholds(config.getini(opt.THRESHOLDS_INI))
    if lines:  # built-in claims (and conftest ones) are known now; test files' own at collection

        thresholds.check_thresholds(lines, audit, registered())

    outputs = {w.flag: path for w in WRITERS if (path := opt.output_path(config, w.flag)) is not None}
    settings = Settings(lines, outputs, opt.value(config, opt.BASELINE), strict=opt.flag(config, opt.STRICT),
                        plan_only=opt.flag(config, opt.PLAN),
                        analyses=opt.analyses_selection(config))  # checked here, before any worker starts
    topo = Topology()
    topo.shard, topo.partials, topo.merge = opt.shards(config)
    run = Lifecycle(audit, topo, partial(_faults, config))
    sess = KvauditSession(config, settings, run, Selection(opt.claim_selection(config)))
    config.stash[SESSION_KEY] = sess
    config.pluginmanager.register(sess, "kvaudit-session")
    sess.gate = gate.open_gate(config, settings, run)  # a baseline that cannot gate this run stops it here
    if _wants_builtin_claims(config, sess.selection.asked):
        suites = str(SUITES_DIR)
        if suites not in config.args:  # xdist workers run this too, from the same invocation args
            config.args.append(suites)
    folder = None  # the xdist run's shard folder, where its stop flag lives
    if config.pluginmanager.hasplugin("xdist"):
        topo.worker, folder = worker_place(config), run_folder(config)
        if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
            sess.controller = XdistController()
            config.pluginmanager.register(sess.controller, "kvaudit-xdist")
            folder = sess.controller.dir
    topo.stop = interrupts.register(config, folder).flag
    if sess.controller is not None:
        sess.controller.stop = topo.stop


def _faults(config: pytest.Config) -> Faults:
    """The deliberate faults a conftest's ``pytest_kvaudit_faults`` asks for (asked when the store first opens)."""
    return config.hook.pytest_kvaudit_faults(config=config) or NO_FAULTS


def _wants_builtin_claims(config: pytest.Config, selection: tuple[str, ...] | None) -> bool:
    """The built-in claims join a run that names a model or a claim selection, unless it names its own test
    paths (then ``--kvaudit-claims`` adds them) or selects none: ``pytest --kvaudit-model=CKPT`` audits
    from any directory, and a project's own ``pytest`` run is left alone."""
    if selection == ():
        return False
    if selection is not None:
        return True
    named = any(opt.value(config, f) is not None for f in (opt.MODEL, opt.SHARD, opt.MERGE))
    return named and config.args_source != pytest.Config.ArgsSource.ARGS


def _claim_name(item: pytest.Item) -> str | None:
    m = item.get_closest_marker("kvaudit_claim")
    return str(m.args[0]) if m is not None and m.args else None


@pytest.hookimpl
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each claim once: a built-in claim that a collected file already holds (a clone's suites/, a copy) is
    dropped; ``--kvaudit-claims`` picks among the built-in ones."""
    sel = config.stash[SESSION_KEY].selection.asked
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
    sess = config.stash[SESSION_KEY]
    if sess.gate is not None and not sess.settings.plan_only:
        gate.add_item(session, items, sess.gate, sess.get_store)
    if sess.settings.plan_only:  # the plan prices the run; no claim computes anything
        for item in filter(uses_store, items):
            item.add_marker(pytest.mark.skip(reason=PLAN_SKIP))


@pytest.hookimpl
def pytest_report_header(config: pytest.Config) -> list[str]:
    c = config.stash[SESSION_KEY].config
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
    return pytestconfig.stash[SESSION_KEY]


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
    return Judge(kvaudit_session, request.node, kvaudit_store)  # type: ignore[arg-type]


@pytest.hookimpl
def pytest_collection_finish(session: pytest.Session) -> None:
    thresholds.at_collection(session.config.stash[SESSION_KEY])


# -- the report -----------------------------------------------------------------------------------
@pytest.hookimpl
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    sess = config.stash[SESSION_KEY]
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
    if hasattr(config, "workerinput"):
        return
    sess = config.stash[SESSION_KEY]
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

