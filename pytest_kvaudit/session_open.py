"""Opening the run's session (:class:`pytest_kvaudit.session.KvauditSession`): its config read from the options and
ini, its thresholds, outputs and baseline gate, the built-in claims joined. At configure when the run names a kvaudit
option or ini key; otherwise when the run turns out to audit (:mod:`pytest_kvaudit.plugin`), so that a project's
unrelated ``pytest`` run imports none of this."""

from __future__ import annotations

from functools import partial

import pytest

from pytest_kvaudit import gate as gates
from pytest_kvaudit import options as opt
from pytest_kvaudit import thresholds
from pytest_kvaudit.claims import registered
from pytest_kvaudit.core.model.config import SUITES_DIR
from pytest_kvaudit.core.runtime.decoder import NO_FAULTS, Faults
from pytest_kvaudit.report.writers import WRITERS
from pytest_kvaudit.session import KvauditSession
from pytest_kvaudit.settings import Selection, Settings
from pytest_kvaudit.workers.lifecycle import Lifecycle
from pytest_kvaudit.workers.topology import Topology
from pytest_kvaudit.xdist_glue import XdistController, place


def open_session(config: pytest.Config, key: pytest.StashKey[KvauditSession],
                 placed: tuple[Topology, XdistController | None] | None = None) -> KvauditSession:
    """The run's session, kept in ``config.stash[key]`` and registered: its config read from the options and ini
    (bad values are one-line usage errors), its baseline gate opened. At configure when the run names a kvaudit
    option (``placed`` None: where the process sits is settled last, as ever); else on the first sign that the run
    audits (:mod:`pytest_kvaudit.plugin`), with the place settled at configure (``placed``)."""
    audit = opt.build_config(config)
    lines = thresholds.parse_thresholds(config.getini(opt.THRESHOLDS_INI))
    if lines:  # built-in claims (and conftest ones) are known now; test files' own at collection
        thresholds.check_thresholds(lines, audit, registered())
    outputs = {w.flag: path for w in WRITERS if (path := opt.output_path(config, w.flag)) is not None}
    settings = Settings(lines, outputs, opt.value(config, opt.BASELINE), strict=opt.flag(config, opt.STRICT),
                        plan_only=opt.flag(config, opt.PLAN),
                        analyses=opt.analyses_selection(config))  # checked here, before any worker starts
    topo = placed[0] if placed is not None else Topology()
    topo.shard, topo.partials, topo.merge = opt.shards(config)
    run = Lifecycle(audit, topo, partial(_faults, config))
    sess = KvauditSession(config, settings, run, Selection(opt.claim_selection(config)))
    config.stash[key] = sess
    config.pluginmanager.register(sess, "kvaudit-session")
    sess.gate = gates.open_gate(config, settings, run)  # a baseline that cannot gate this run stops it here
    if _wants_builtin_claims(config, sess.selection.asked):
        suites = str(SUITES_DIR)
        if suites not in config.args:  # xdist workers run this too, from the same invocation args
            config.args.append(suites)
    sess.controller = placed[1] if placed is not None else place(config, topo)
    return sess


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
