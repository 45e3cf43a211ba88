"""``--kvaudit-baseline``: the checkpoint gate, on the pytest side.

* At configure, before anything loads, the baseline is read and checked against the run
  (:mod:`pytest_kvaudit.core.gate.identity`): a missing or damaged baseline, or one recorded for another architecture,
  item set, n or settings, is a one-line-per-field usage error within seconds, never a verdict after hours.
* ``kvaudit::baseline`` is a test item of its own, collected when a baseline is given: it compares the two
  ledgers token for token (:mod:`pytest_kvaudit.core.gate.ledger_diff`) and fails, with a diff, when a rule
  (``--kvaudit-baseline-fail``) calls a movement a regression. Being a test, it runs wherever the store is
  (an xdist worker, a merge) and its outcome is in pytest's summary, so the summary matches the exit status.
* A claim that passed in the baseline and no longer does fails its own test, saying so (:meth:`Gate.check_verdict`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import options as opt
from pytest_kvaudit.claims import registered
from pytest_kvaudit.core.cost import ledger as L
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.gate.identity import mismatches, recorded_identity
from pytest_kvaudit.core.gate.ledger_diff import compare, findings, with_text
from pytest_kvaudit.core.gate.rules import Rules
from pytest_kvaudit.report.comparison import comparable, gate_diff, load_baseline
from pytest_kvaudit.verdict_relay import GATE_PROP

if TYPE_CHECKING:
    from collections.abc import Callable

    from pytest_kvaudit.claims.base import ClaimResult
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.settings import Settings
    from pytest_kvaudit.workers.lifecycle import Lifecycle

NODE_NAME = "kvaudit::baseline"


@dataclass
class Gate:
    """The baseline a run is gated on: its report, where its ledger is, and the rules."""

    path: Path
    report: dict[str, Any]
    rules: Rules
    ledger: Path | None  # None: a report file with no ledger beside it (counts and verdicts only)
    notes: list[str] = field(default_factory=list)
    #: the baseline's ledger, read and validated at configure (None: no ledger, or an xdist worker's gate)
    recorded: dict[str, Any] | None = None
    #: what the kvaudit::baseline test found (from whichever process ran it)
    result: dict[str, Any] | None = None

    @property
    def digest(self) -> str:
        return str(self.report.get("model", {}).get("weights_digest", ""))

    def comparable(self, name: str) -> bool:
        """A claim's baseline verdict is the checkpoint's (not a recording run's, not a missing ledger's)."""
        return name in self.report.get("claims", {}) and comparable(self.report, name)

    def check_verdict(self, result: ClaimResult, display: dict[str, Any]) -> str | None:
        """Why ``result`` fails the gate against its baseline verdict, or None."""
        was = self.report.get("claims", {}).get(result.name, {}).get("status")
        if was is None or not self.comparable(result.name) or display.get("comparable") is False:
            return None
        if self.rules.verdict(was, result.status) != "regression":
            return None
        return (f"REGRESSION from the baseline {self.path}: {result.name} was {was}, now {result.status} "
                f"({opt.BASELINE_FAIL}={self.rules.text()}): {result.reason}")


def ledger_name(cfg: AuditConfig) -> Path:
    """Where a snapshots/<slug>/ folder keeps its ledger, as the claim that records it says (its last two parts)."""
    rec = next((p for c in registered() if (p := c.recorded_run(cfg)) is not None), None)
    return Path(*rec.parts[-2:]) if rec is not None else Path("ledger.json")


def _ledger_beside(p: Path, name: Path) -> Path | None:
    folder = p if p.is_dir() else p.parent
    return folder / name if (folder / name).is_file() else None


def open_gate(config: pytest.Config, settings: Settings, run: Lifecycle) -> Gate | None:
    """Read and check the baseline at configure time, its ledger included, so that a baseline that cannot gate
    this run (damaged, truncated, or recorded for another model, item set, n or settings) is a usage error
    within seconds, one line a reason; ``--kvaudit-plan`` checks it as the run would."""
    if settings.baseline is None:
        # the rules say what fails a comparison; asked for on the command line with nothing to compare, they would
        # be silently ignored. Their ini twin is read only with a baseline, so a project's ini serves record runs too
        if config.getoption(opt.dest(opt.BASELINE_FAIL)) not in (None, ""):
            raise pytest.UsageError(f"{opt.BASELINE_FAIL} says what fails the baseline gate, and no baseline is given: "
                                    f"add {opt.BASELINE}=DIR (a recorded run's snapshots folder) or leave it out")
        return None

    try:
        rules = Rules.parse(opt.value(config, opt.BASELINE_FAIL), opt.source(config, opt.BASELINE_FAIL))
        path = Path(settings.baseline)
        gate = Gate(path, load_baseline(path), rules, _ledger_beside(path, ledger_name(run.config)))
        if hasattr(config, "workerinput"):
            return gate  # the controller checked it
        ident = run.identity(strict=True)
    except (KvauditError, OSError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None
    try:
        gate.recorded = L.read(gate.ledger) if gate.ledger is not None else None
    except (KvauditError, OSError, ValueError) as exc:
        raise pytest.UsageError(f"{opt.BASELINE}={settings.baseline} cannot gate this run: {exc}") from None
    resolved = {"attn": gate.report.get("environment", {}).get("attn_implementation")}
    bad = mismatches(recorded_identity(gate.report), ident, resolved)
    if bad:
        raise pytest.UsageError(f"{opt.BASELINE}={settings.baseline} cannot gate this run (nothing computed):\n  "
                                + "\n  ".join(bad) + "\nRecord a baseline with the same items and settings "
                                "(--snapshot-update), or run with the baseline's items and settings.")
    if gate.ledger is None:
        gate.notes.append(f"{path}: no ledger beside the report ({ledger_name(run.config)}), so verdicts are compared, "
                          "and trajectories and divergent sets are not.")
    return gate


class BaselineItem(pytest.Item):
    """``kvaudit::baseline``: the run's ledger against the baseline's, judged by the rules."""

    #: it reads the store as a test using the fixture does: an xdist worker computes its share for it
    fixturenames = ("kvaudit_store",)
    gate: Gate  # set by :func:`add_item`
    get_store: Callable[[], Store]  # the run's store: fails with the run's error, skips in a runner's shard

    def runtest(self) -> None:
        gate = self.gate
        store = self.get_store()
        current = L.build(store)
        if gate.ledger is None:
            pytest.skip(gate.notes[-1] if gate.notes
                        else "The baseline has no ledger, so trajectories are not compared.")
        try:
            recorded = gate.recorded if gate.recorded is not None else L.read(gate.ledger)
        except KvauditError as exc:
            pytest.fail(str(exc), pytrace=False)
        diff = with_text(compare(recorded, current), _decoder(store))
        found = findings(diff, gate.rules)
        result = {"rules": gate.rules.text(), "ledger": str(gate.ledger) if gate.ledger else None,
                  "weights_digest": {"baseline": gate.digest, "run": store.identity.get("weights_digest")},
                  "precisions": diff, "findings": found,
                  # bits differ across CPUs and libraries: a moved trajectory may be the environment's, said beside it
                  "environment": [d for d in L.identity_differences(recorded, current, False)
                                  if d.startswith("environment.")]}
        self.user_properties.append((GATE_PROP, json.dumps(result)))
        gate.result = result
        regressions = [f for f in found if f["kind"] == "regression"]
        if regressions:
            raise GateRegression(result, str(gate.path))

    def repr_failure(self, excinfo: Any, style: Any = None) -> Any:
        if isinstance(excinfo.value, GateRegression):
            return "\n".join(gate_diff(excinfo.value.result, excinfo.value.path))
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, NODE_NAME


def _decoder(store: Any) -> Any:
    """The run's tokenizer as ``decode(dtype, ids)``, for a diff's text; None where the engine has none."""
    def decode(dtype: str, ids: list[int]) -> str:
        return str(store.handle(dtype).tokenizer.decode(ids))

    return decode if hasattr(store, "handle") else None


class GateRegression(Exception):
    """Raised by ``kvaudit::baseline`` on a regression; its failure shows the diff, not a traceback."""

    def __init__(self, result: dict[str, Any], path: str) -> None:
        super().__init__("regression from the baseline")
        self.result, self.path = result, path


def add_item(session: pytest.Session, items: list[pytest.Item], gate: Gate, get_store: Callable[[], Store]) -> None:
    """Collect ``kvaudit::baseline`` when a baseline is given (every xdist worker collects the same one)."""
    item = BaselineItem.from_parent(session, name=NODE_NAME, nodeid=NODE_NAME)
    item.gate, item.get_store = gate, get_store
    items.append(item)
