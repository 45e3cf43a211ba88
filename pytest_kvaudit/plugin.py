"""kvaudit's pytest hooks: options, the session on ``config.stash``, fixtures, progress and the summary.

Importing this module is cheap (no torch): the store, and with it torch and transformers, loads in
the ``kvaudit_store`` fixture the first time a claim needs it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .config import AuditConfig, BoundaryRule, parse_chunks, parse_device, parse_dtypes
from .errors import KvauditError

if TYPE_CHECKING:
    from .store import Store
    from .verdicts import ClaimResult

MODEL = "--kvaudit-model"
DTYPES = "--kvaudit-dtypes"
DEVICE = "--kvaudit-device"
DEVICE_MAP = "--kvaudit-device-map"
TF32 = "--kvaudit-tf32"
ATTN = "--kvaudit-attn"
ITEMS = "--kvaudit-items"
N = "--kvaudit-n"
BOUNDARY = "--kvaudit-boundary"
ANSWER_REGEX = "--kvaudit-answer-regex"
MAX_NEW_TOKENS = "--kvaudit-max-new-tokens"
SEED = "--kvaudit-seed"
REPORT = "--kvaudit-report"
CHUNKS = "--kvaudit-chunks"
DONOR_UNITS = "--kvaudit-donor-units"
THREADS = "--kvaudit-threads"
TRUST_REMOTE_CODE = "--kvaudit-trust-remote-code"
ALLOW_PICKLE = "--kvaudit-allow-pickle"
CHAT_TEMPLATE = "--kvaudit-chat-template"
SNAPSHOTS = "--kvaudit-snapshots"
BASELINE = "--kvaudit-baseline"
HTML = "--kvaudit-html"
LEDGER_TOKENS_ONLY = "--kvaudit-ledger-tokens-only"
THRESHOLDS_INI = "kvaudit_thresholds"

#: flag -> help; every flag has an ini twin named like its dest (kvaudit_model, ...)
_VALUE_OPTIONS: dict[str, str] = {
    MODEL: "checkpoint directory or hub id (default: the embedded checkpoint)",
    DTYPES: "comma list of precisions to run, first one fixes the 2x2's prefix (default: bf16,fp32)",
    DEVICE: "auto, cpu, cuda or cuda:N (default: auto; under xdist worker i takes GPU i mod the GPU count)",
    TF32: "on or off: TF32 matmuls and convolutions for the fp32 cells on CUDA (default: torch's setting)",
    DEVICE_MAP: "a from_pretrained device_map such as auto, for a checkpoint bigger than one GPU (needs accelerate)",
    ATTN: "attention implementation(s), e.g. sdpa or eager,sdpa: the first runs the claims, the rest add axis rows",
    ITEMS: "item set JSONL (default: the checkpoint's items.jsonl)",
    N: "use the first N items",
    BOUNDARY: "boundary marker string, or tokens:K (default: the item set's)",
    ANSWER_REGEX: "regex whose first group is the answer (default: the item set's)",
    MAX_NEW_TOKENS: "generation budget per trajectory (default: the item set's)",
    SEED: "seed of the paired bootstrap (default: 0); shard plans need none, they are round-robin",
    REPORT: "write the JSON report to this path",
    HTML: "write the human report (tables and figures) as HTML to this path",
    CHUNKS: "comma list of chunk sizes C: adds chunked(C) constructions",
    DONOR_UNITS: "at most this many divergent items get transplants (default: 64)",
    BASELINE: "compare verdicts and figures with a recorded run (snapshots/<slug>/ or a report JSON)",
    SNAPSHOTS: "folder of recorded ledgers (default: snapshots/ under the rootdir)",
    THREADS: "torch CPU threads per process (default: 1, so that bits do not depend on -n)",
}
_FLAG_OPTIONS: dict[str, str] = {
    TRUST_REMOTE_CODE: "allow checkpoints that need custom code (off by default)",
    ALLOW_PICKLE: "allow pickle (.bin) weights (off by default: safetensors only)",
    CHAT_TEMPLATE: "wrap prompts in the tokenizer's chat template",
    LEDGER_TOKENS_ONLY: "audit ledgers on token-level fields only (a cross-machine audit)",
}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


@pytest.hookimpl
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvaudit", "kvaudit: does the KV cache survive stage replay")
    for flag, help_ in _VALUE_OPTIONS.items():
        group.addoption(flag, dest=_dest(flag), default=None, help=help_)
        parser.addini(_dest(flag), help_, default="")
    for flag, help_ in _FLAG_OPTIONS.items():
        group.addoption(flag, dest=_dest(flag), action="store_true", default=False, help=help_)
        parser.addini(_dest(flag), help_, type="bool", default=False)
    parser.addini(THRESHOLDS_INI, "claim thresholds, one 'claim.key=value' a line", type="linelist", default=[])


def _value(config: pytest.Config, flag: str) -> str | None:
    v = config.getoption(_dest(flag)) or config.getini(_dest(flag))
    return str(v) if v not in (None, "") else None


def _int(config: pytest.Config, flag: str) -> int | None:
    v = _value(config, flag)
    if v is None:
        return None
    try:
        return int(v)
    except ValueError:
        raise pytest.UsageError(f"{flag}={v!r} is not an integer") from None


def build_config(config: pytest.Config) -> AuditConfig:
    """Options and ini -> AuditConfig; bad values are a one-line usage error."""
    try:
        cfg = AuditConfig()
        kw: dict[str, Any] = {}
        if (m := _value(config, MODEL)) is not None:
            kw["model"] = m
        kw["items"] = _value(config, ITEMS)
        kw["n"] = _int(config, N)
        kw["dtypes"] = parse_dtypes(_value(config, DTYPES) or "bf16,fp32")
        kw["device"] = parse_device(_value(config, DEVICE) or "auto")
        kw["device_map"] = _value(config, DEVICE_MAP)
        tf32 = _value(config, TF32)
        if tf32 is not None and tf32 not in ("on", "off"):
            raise KvauditError(f"{TF32}={tf32!r}: use on or off")
        kw["tf32"] = None if tf32 is None else tf32 == "on"
        attns = [a.strip() for a in (_value(config, ATTN) or "").split(",") if a.strip()]
        kw["attn"] = attns[0] if attns else None
        kw["attn_axes"] = tuple(attns[1:])
        if (b := _value(config, BOUNDARY)) is not None:
            BoundaryRule.parse(b)
            kw["boundary"] = b
        kw["answer_regex"] = _value(config, ANSWER_REGEX)
        kw["max_new_tokens"] = _int(config, MAX_NEW_TOKENS)
        kw["seed"] = _int(config, SEED) or 0
        kw["chunks"] = parse_chunks(_value(config, CHUNKS))
        if (d := _int(config, DONOR_UNITS)) is not None:
            kw["donor_max_units"] = d
        kw["threads"] = _int(config, THREADS)
        for flag, attr in ((TRUST_REMOTE_CODE, "trust_remote_code"), (ALLOW_PICKLE, "allow_pickle"),
                           (CHAT_TEMPLATE, "chat_template")):
            kw[attr] = bool(config.getoption(_dest(flag)) or config.getini(_dest(flag)))
        return cfg.replace(**kw)
    except KvauditError as exc:
        raise pytest.UsageError(str(exc)) from None


def parse_thresholds(lines: list[str]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        key, sep, val = line.partition("=")
        claim, dot, name = key.strip().partition(".")
        try:
            if not sep or not dot:
                raise ValueError
            out.setdefault(claim, {})[name.strip()] = float(val)
        except ValueError:
            raise pytest.UsageError(f"{THRESHOLDS_INI}: {line!r} is not 'claim.key=number'") from None
    return out


@dataclass
class KvauditSession:
    """The run's state: its config, the store (built on first use) and the claims judged so far."""

    config: AuditConfig
    pytest_config: pytest.Config
    thresholds: dict[str, dict[str, float]]
    report_path: Path | None
    store: Store | None = None
    error: str | None = None
    claims: dict[str, ClaimResult] = field(default_factory=dict)
    run_info: dict[str, Any] = field(default_factory=dict)
    shard: tuple[int, int, Path] | None = None  # (index, count, folder) on a sharding xdist worker
    started: float = field(default_factory=time.perf_counter)

    def get_store(self) -> Store:
        """The run's store: computed here, or merged from every xdist worker's shard."""
        if self.store is None and self.error is None:
            try:
                self.store = self._merge_shards() if self.shard else self._compute()
            except KvauditError as exc:
                self.error = str(exc)
        if self.error is not None:
            pytest.fail(self.error, pytrace=False)
        assert self.store is not None
        return self.store

    def _open(self, shard_index: int = 0, shard_count: int = 1) -> Store:
        import torch

        from .store import Store

        # One CPU thread per process by default: thread count changes the bits of CPU matmuls, and
        # verdicts must not depend on -n. --kvaudit-threads trades that for speed.
        torch.set_num_threads(self.config.threads or 1)
        cfg = self.config
        if cfg.tf32 is not None:  # recorded in the environment block, so ledgers of the two settings differ
            torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
            torch.backends.cudnn.allow_tf32 = cfg.tf32
        if self.shard is not None and cfg.device == "auto" and cfg.device_map is None and torch.cuda.is_available():
            # one GPU per worker: worker i takes GPU i mod the number of GPUs
            cfg = cfg.replace(device=f"cuda:{max(0, self.shard[0]) % torch.cuda.device_count()}")
        return Store.open(cfg, shard_index, shard_count)

    def _compute(self) -> Store:
        store = self._open()
        store.compute(progress=self._progress())
        return store

    def compute_shard(self) -> None:
        """On an xdist worker, before any test: compute this worker's shard and hand it to the others."""
        from .xdist_glue import write_shard, write_shard_error

        assert self.shard is not None
        index, count, folder = self.shard
        if index < 0:
            return
        try:
            store = self._open(index, count)
            store.compute()
            write_shard(folder, index, store.export())
        except KvauditError as exc:
            write_shard_error(folder, index, str(exc))

    def _merge_shards(self) -> Store:
        from .store import Store
        from .xdist_glue import collect_shards

        assert self.shard is not None
        _, count, folder = self.shard
        got = collect_shards(folder, count)
        if got["error"]:
            raise KvauditError(got["error"])
        cfg, item_set = Store.resolve(self.config)
        return Store.merged(cfg, item_set, got["exports"])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Any:
        if self.shard is not None and not session.config.option.collectonly:
            self.compute_shard()
        return (yield)

    def _progress(self) -> Callable[[int, int, int, float], None] | None:
        tr = self.pytest_config.pluginmanager.get_plugin("terminalreporter")
        cap = self.pytest_config.pluginmanager.get_plugin("capturemanager")
        if tr is None or hasattr(self.pytest_config, "workerinput"):
            return None
        tty = bool(getattr(tr, "isatty", False))
        state = {"shown": 0.0, "decile": 0}

        def show(done: int, total: int, tokens: int, seconds: float) -> None:
            # a terminal gets one line rewritten in place; a log gets a line every tenth of the work
            decile = done * 10 // total
            if done < total and ((tty and seconds - state["shown"] < 0.5) or (not tty and decile == state["decile"])):
                return
            state["shown"], state["decile"] = seconds, decile
            rate = tokens / seconds if seconds > 0 else 0.0
            left = seconds / done * (total - done) if done else 0.0
            msg = f"kvaudit: {done}/{total} item x precision cells, {rate:,.0f} tokens/s, ~{left:.0f}s left"
            ctx = cap.global_and_fixture_disabled() if cap is not None else _null()
            with ctx:
                if tty:
                    tr.rewrite(msg, erase=True)
                    if done == total:
                        tr.write_line("")
                else:
                    tr.ensure_newline()
                    tr.write_line(msg)

        return show

    def record(self, result: ClaimResult, node: pytest.Item) -> None:
        self.claims[result.name] = result
        node.user_properties.append(("kvaudit_claim", json.dumps(result.to_dict(), default=list)))
        if self.store is not None and not self.run_info:
            from .analyses import build as analyses
            from .report import items_block

            s = self.store
            self.run_info = {
                "analyses": analyses(list(s.records.values()), self.config.sweep_units),
                "model": s.identity,
                "environment": s.environment,
                "items": items_block(s.records.values(), [i.id for i in s.items]),
                "cost": {k: getattr(s.cost, k) for k in ("forward_calls", "forward_tokens", "minimal_forward_tokens", "seconds")},
            }
        if self.run_info:
            node.user_properties.append(("kvaudit_run", json.dumps(self.run_info, default=list)))

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Collect claim results from test reports: the controller sees the workers' claims under xdist."""
        props = dict(report.user_properties)
        if "kvaudit_claim" not in props or report.when == "teardown":
            return
        from .verdicts import ClaimResult

        d = json.loads(str(props["kvaudit_claim"]))
        d["interval"] = tuple(d["interval"])
        self.claims[d["name"]] = ClaimResult(**d)
        if "kvaudit_run" in props and not self.run_info:
            self.run_info = json.loads(str(props["kvaudit_run"]))


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: object) -> None:
        return None


SESSION_KEY = pytest.StashKey[KvauditSession]()


@pytest.hookimpl
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "kvaudit_claim(name, **thresholds): a kvaudit claim test and its threshold overrides"
    )
    rp = _value(config, REPORT)
    sess = KvauditSession(build_config(config), config, parse_thresholds(config.getini(THRESHOLDS_INI)),
                          Path(rp) if rp else None)
    config.stash[SESSION_KEY] = sess
    config.pluginmanager.register(sess, "kvaudit-session")
    if config.pluginmanager.hasplugin("xdist"):
        from .xdist_glue import XdistController, worker_shard

        sess.shard = worker_shard(config)
        if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
            config.pluginmanager.register(XdistController(), "kvaudit-xdist")


@pytest.hookimpl
def pytest_report_header(config: pytest.Config) -> list[str]:
    c = config.stash[SESSION_KEY].config
    return [
        f"kvaudit: model={c.model} dtypes={','.join(c.dtypes)} device={c.device} "
        f"attn={c.attn or 'checkpoint default'} seed={c.seed}"
    ]


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


class Judge:
    """Turns a ClaimResult into the test's outcome: pass, fail (naming counterexamples) or skip (inconclusive)."""

    def __init__(self, session: KvauditSession, node: pytest.Item, store: Store) -> None:
        self.session, self.node, self.store = session, node, store

    def thresholds(self, name: str, **overrides: float) -> dict[str, float]:
        from .verdicts import thresholds

        marker = self.node.get_closest_marker("kvaudit_claim")
        base = {"seed": self.session.config.seed} if name == "matched_construction" else {}
        merged = {**base, **(marker.kwargs if marker else {}), **self.session.thresholds.get(name, {}), **overrides}
        return thresholds(name, merged)

    def claim(self, name: str | None = None, **overrides: float) -> ClaimResult:
        """Judge a built-in claim (named here or by the test's ``kvaudit_claim`` marker)."""
        from .verdicts import JUDGES

        if name is None:
            marker = self.node.get_closest_marker("kvaudit_claim")
            if marker is None or not marker.args:
                raise pytest.UsageError(f"{self.node.nodeid}: name the claim, kvaudit_judge.claim('replica_exactness')")
            name = str(marker.args[0])
        th = self.thresholds(name, **overrides)
        if name == "donor_following":
            th["max_units"] = float(self.session.config.donor_max_units)
        if name == "layer_sweep":
            th["max_units"] = float(self.session.config.sweep_units)
        result = JUDGES[name](list(self.store.records.values()), th, self.session.config.dtypes)
        if self.store.missing and result.status == "pass":
            result.status = "inconclusive"
            result.reason = f"{len(self.store.missing)} items missing (a worker died): {result.reason}"
        return self.verdict(result)

    def exact(self, name: str, units: dict[str, bool], min_units: int = 1, reason: str = "") -> ClaimResult:
        """A custom exactness claim: ``units`` maps unit name -> property holds. Fails on one counterexample."""
        from .stats import wilson_interval
        from .verdicts import FAIL, INCONCLUSIVE, PASS, ClaimResult

        bad = [u for u, ok in units.items() if not ok]
        n, k = len(units), len(units) - len(bad)
        status = FAIL if bad else INCONCLUSIVE if n < min_units else PASS
        why = f"fails on {', '.join(bad[:8])}" if bad else f"{n} units, needs {min_units}" if n < min_units else f"holds on {k}/{n}"
        return self.verdict(ClaimResult(name, status, n, k, wilson_interval(k, n), reason or why, {}, bad))

    def ledger(self, snapshot: Any) -> ClaimResult:
        """The ledger audit: record with ``--snapshot-update``; otherwise every recorded unit must reproduce."""
        from . import ledger as L
        from .snapshot import extension_for
        from .verdicts import FAIL, INCONCLUSIVE, PASS, ClaimResult

        cfg, pc = self.session.config, self.session.pytest_config
        root = Path(_value(pc, SNAPSHOTS) or pc.rootpath / "snapshots")
        tokens_only = bool(pc.getoption(_dest(LEDGER_TOKENS_ONLY)) or pc.getini(_dest(LEDGER_TOKENS_ONLY)))
        ext = extension_for(root, L.slug(cfg.model), tokens_only)
        snap = snapshot.use_extension(ext)
        path = ext.ledger_path(snap.test_location)
        current = L.build(self.store)
        name = "ledger_audit"

        def result(status: str, reason: str, n: int = 0, k: int = 0, figs: dict | None = None,
                   bad: list[str] | None = None) -> ClaimResult:
            from .stats import wilson_interval

            return self.verdict(ClaimResult(name, status, n, k, wilson_interval(k, n), reason, figs or {}, bad or []))

        if snap.session.update_snapshots:
            assert snap == current
            return result(INCONCLUSIVE, f"ledger of {len(current['units'])} units recorded to {path}; "
                                        "a plain run audits against it")
        if not path.is_file():
            return result(INCONCLUSIVE, f"no ledger recorded for this model at {path}: record one with --snapshot-update")
        try:
            recorded = L.parse(path.read_text(encoding="utf-8"), str(path))
        except KvauditError as exc:
            return result(FAIL, str(exc))
        diffs = L.identity_differences(recorded, current, tokens_only)
        a = L.audit(recorded, current, tokens_only)
        if diffs:
            model_diff = any(d.startswith(("model.", "config.")) for d in diffs)
            fix = ("record a ledger for this checkpoint with --snapshot-update (or --kvaudit-snapshots=DIR)" if model_diff
                   else "audit token-level fields only with --kvaudit-ledger-tokens-only, or re-record here")
            moved = [f"{u} ({', '.join(f[:2])})" for u, f in a.mismatches.items()]
            units = (f"; {len(moved)}/{a.units} units differ: {'; '.join(moved[:4])}{' and more' if len(moved) > 4 else ''}"
                     if moved else "")
            return result(FAIL, f"ledger {path} was recorded for another "
                                f"{'model' if model_diff else 'environment'}: {'; '.join(diffs)}; {fix}{units}",
                          a.units, a.reproduced, {"identity_differences": diffs}, list(a.mismatches))
        figs = {"reproduced": a.reproduced, "units": a.units, "not_recorded": len(a.not_recorded), "not_run": a.not_run,
                "tokens_only": tokens_only, "ledger": str(path)}
        if a.mismatches:
            bad = [f"{u} ({', '.join(f[:3])}{'...' if len(f) > 3 else ''})" for u, f in a.mismatches.items()]
            return result(FAIL, f"{len(bad)}/{a.units} units not reproduced: {'; '.join(bad[:6])}"
                                f"{' and more' if len(bad) > 6 else ''}", a.units, a.reproduced, figs, bad)
        th = self.thresholds(name)
        if a.units < th["min_units"]:
            return result(INCONCLUSIVE, f"{a.units} units both recorded and run, needs {int(th['min_units'])}",
                          a.units, a.reproduced, figs)
        assert snap == current  # syrupy's own bookkeeping: the ledger is used, and it matches
        return result(PASS, f"all {a.units} recorded units reproduced"
                            f"{' (token-level fields)' if tokens_only else ' (ids, labels and every fingerprint)'}",
                      a.units, a.reproduced, figs)

    def verdict(self, result: ClaimResult) -> ClaimResult:
        self.session.record(result, self.node)
        if result.status == "fail":
            pytest.fail(f"{result.name} FAILED: {result.reason}", pytrace=False)
        if result.status == "inconclusive":
            pytest.skip(f"{result.name} inconclusive: {result.reason}")
        return result


@pytest.fixture
def kvaudit_judge(request: pytest.FixtureRequest, kvaudit_session: KvauditSession, kvaudit_store: Store) -> Judge:
    """Judge a claim: ``kvaudit_judge.claim()``, ``kvaudit_judge.exact(name, units)``, ``.verdict(result)``."""
    return Judge(kvaudit_session, request.node, kvaudit_store)  # type: ignore[arg-type]


def _report(sess: KvauditSession) -> dict[str, Any] | None:
    from .report import build, compare, load_baseline

    if not sess.claims:
        return None
    info = sess.run_info or {}
    rep = build(
        info.get("model", {}),
        info.get("environment", {}),
        info.get("items", {"total": 0, "eligible": 0, "ineligible": {}}),
        sess.claims,
        info.get("cost", {}),
        analyses=info.get("analyses", {}),
        config={"dtypes": list(sess.config.dtypes), "n": sess.config.n, "seed": sess.config.seed},
    )
    base = _value(sess.pytest_config, BASELINE)
    if base:
        try:
            rep["baseline"] = {"path": base, **compare(load_baseline(Path(base)), rep)}
        except KvauditError as exc:
            rep["baseline"] = {"path": base, "error": str(exc), "changes": []}
    return rep


def _snapshot_report_path(config: pytest.Config, sess: KvauditSession) -> Path:
    from .ledger import slug

    root = Path(_value(config, SNAPSHOTS) or config.rootpath / "snapshots")
    return root / slug(sess.config.model) / "report.json"


@pytest.hookimpl
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    sess = config.stash[SESSION_KEY]
    rep = _report(sess)
    if rep is None:
        if sess.error:
            terminalreporter.write_sep("=", "kvaudit")
            terminalreporter.write_line(f"kvaudit could not run: {sess.error}")
        return
    from .report import lines

    terminalreporter.write_sep("=", "kvaudit claims")
    for line in lines(rep):
        terminalreporter.write_line(line)
    if "baseline" in rep:
        from .report import compare_lines

        terminalreporter.write_sep("-", f"kvaudit: changes from the baseline {rep['baseline']['path']}")
        for line in [rep["baseline"]["error"]] if "error" in rep["baseline"] else compare_lines(rep["baseline"]):
            terminalreporter.write_line(line)
    if sess.report_path is not None:
        terminalreporter.write_line(f"report written to {sess.report_path}")


@pytest.hookimpl
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return
    sess = config.stash[SESSION_KEY]
    rep = _report(sess)
    if rep is None:
        return
    from .report import atomic_write_text, dumps

    if sess.report_path is not None:
        atomic_write_text(sess.report_path, dumps(rep))
    if (html_path := _value(config, HTML)) is not None:
        from .html import write

        write(rep, Path(html_path))
    if config.getoption("update_snapshots", False) and "ledger_audit" in sess.claims:
        # the run's verdicts beside its ledger: what --kvaudit-baseline compares a new checkpoint with
        atomic_write_text(_snapshot_report_path(config, sess), dumps({k: v for k, v in rep.items() if k != "baseline"}))
