"""The pytest side of a run that audits: its session opened (:func:`open_run`) and what the plugin's hooks do for
it (:class:`RunHooks`). :mod:`pytest_kvaudit.plugin` imports this module once the run audits, at configure when it
names a kvaudit option, otherwise when it collects a kvaudit test or, on an xdist controller, sees a verdict: a
project's unrelated ``pytest`` run loads none of it (no config, no engine record, no claims)."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from pytest_kvaudit import gate as gates
from pytest_kvaudit import option_values as ov
from pytest_kvaudit import options as opt
from pytest_kvaudit import thresholds
from pytest_kvaudit.claims import registered
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.compute.store import Store
from pytest_kvaudit.core.cost.ledger import snapshot_folder
from pytest_kvaudit.core.model.config import SUITES_DIR
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
from pytest_kvaudit.xdist_glue import XdistController, place

PLAN_SKIP = "kvaudit plan only (--kvaudit-plan): planned, not run"


class RunHooks:
    """What the plugin's hooks do in a run that audits, on its :class:`KvauditSession`."""

    def __init__(self, config: pytest.Config, session: KvauditSession) -> None:
        self.config, self.session = config, session

    def judge(self, node: pytest.Item, store: Store) -> Judge:
        return Judge(self.session, node, store)

    def modify_items(self, session: pytest.Session, items: list[pytest.Item]) -> None:
        """Each claim once: a built-in claim that a collected file already holds (a clone's suites/, a copy) is
        dropped; ``--kvaudit-claims`` picks among the built-in ones."""
        sess, config = self.session, self.config
        sel = sess.selection.asked
        seen: set[str] = set()
        keep, drop = [], []
        for item in items:
            name = _claim_name(item)
            builtin = Path(str(item.path)).parent == SUITES_DIR
            if name is not None and (name in seen or (builtin and sel is not None and sel != ("all",)
                                                      and name not in sel)):
                drop.append(item)
                continue
            if name is not None:
                seen.add(name)
            keep.append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
        if sess.gate is not None and not sess.settings.plan_only:
            gates.add_item(session, items, sess.gate, sess.get_store)
        if sess.settings.plan_only:  # the plan prices the run; no claim computes anything
            for item in filter(uses_store, items):
                item.add_marker(pytest.mark.skip(reason=PLAN_SKIP))

    def header(self) -> list[str]:
        c = self.session.config
        return [
            f"kvaudit: model={c.model} dtypes={','.join(c.dtypes)} device={c.device} "
            f"attn={c.attn or 'checkpoint default'} seed={c.seed}",
            f"kvaudit: {header_line(c.chat_template, checkpoint_source(c.model))}",
            *([f"kvaudit: replicas and the bridge on the first {c.exact_items} items of the set "
               "(--kvaudit-exact-items); every other claim reads every item"] if c.exact_items is not None else []),
        ]

    def collection_finish(self) -> None:
        thresholds.at_collection(self.session)

    def terminal_summary(self, tr: Any) -> None:
        sess = self.session
        said = sess.verdicts
        for note in said.notes:
            tr.write_line(f"kvaudit: {note}", yellow=True)
        if said.plan is not None:
            tr.write_sep("=", "kvaudit plan (nothing computed beyond the calibration)")
            for line in plan_lines(said.plan):
                tr.write_line(line)
        if said.strict_line is not None:
            tr.write_line(f"kvaudit: FAILED: {said.strict_line}", red=True)
        if said.shard_line is not None:
            bad = said.shard_line.startswith("FAILED")
            tr.write_line(f"kvaudit: {said.shard_line}", red=bad, green=not bad)
        if said.interrupted:
            tr.write_line("kvaudit: interrupted: no claim judged on the whole run, no report written", yellow=True)
            return
        rep = said.report if said.report is not None else run_report(sess)
        if rep is None:
            if sess.run.error:
                tr.write_sep("=", "kvaudit")
                tr.write_line(f"kvaudit could not run: {sess.run.error}")
            return
        tr.write_sep("=", "kvaudit claims")
        for line in lines(rep):
            tr.write_line(line)
        if "baseline" in rep:
            tr.write_sep("-", f"kvaudit: changes from the baseline {rep['baseline']['path']}")
            for line in compare_lines(rep["baseline"]):
                tr.write_line(line, red=line.startswith("REGRESSION"), green=line.startswith("improvement"))
        if (path := report_path(sess.settings.outputs)) is not None:
            tr.write_line(f"report written to {path}")

    def session_finish(self, session: pytest.Session) -> None:
        sess, config = self.session, self.config
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


def open_run(config: pytest.Config, placed: tuple[Topology, XdistController | None] | None = None) -> RunHooks:
    """The run's session, registered: its config read from the options and ini (bad values are one-line usage
    errors), its baseline gate opened. At configure when the run names a kvaudit option (``placed`` None: where the
    process sits is settled last, as ever); else on the first sign that the run audits, with the place settled at
    configure (``placed``)."""
    audit = ov.build_config(config)
    limits = thresholds.parse_thresholds(config.getini(opt.THRESHOLDS_INI))
    if limits:  # built-in claims (and conftest ones) are known now; test files' own at collection
        thresholds.check_thresholds(limits, audit, registered())
    outputs = {w.flag: path for w in WRITERS if (path := ov.output_path(config, w.flag)) is not None}
    settings = Settings(limits, outputs, opt.value(config, opt.BASELINE), strict=opt.flag(config, opt.STRICT),
                        plan_only=opt.flag(config, opt.PLAN),
                        analyses=ov.analyses_selection(config))  # checked here, before any worker starts
    topo = placed[0] if placed is not None else Topology()
    topo.shard, topo.partials, topo.merge = ov.shards(config)
    run = Lifecycle(audit, topo, partial(_faults, config))
    sess = KvauditSession(config, settings, run, Selection(ov.claim_selection(config)))
    config.pluginmanager.register(sess, "kvaudit-session")
    sess.gate = gates.open_gate(config, settings, run)  # a baseline that cannot gate this run stops it here
    if _wants_builtin_claims(config, sess.selection.asked):
        suites = str(SUITES_DIR)
        if suites not in config.args:  # xdist workers run this too, from the same invocation args
            config.args.append(suites)
    sess.controller = placed[1] if placed is not None else place(config, topo)
    return RunHooks(config, sess)


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


def _plan_only(session: pytest.Session, sess: KvauditSession) -> None:
    """--kvaudit-plan: price the run when it holds a kvaudit test (under xdist the controller sees the skips)."""
    stats = getattr(session.config.pluginmanager.get_plugin("terminalreporter"), "stats", {})
    if not any(PLAN_SKIP in str(getattr(r, "longrepr", "")) for r in stats.get("skipped", [])):
        return
    sess.plan_run(int(getattr(session.config.option, "numprocesses", 0) or 1))
    if sess.run.error is not None:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED

