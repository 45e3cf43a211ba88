"""The saved ledger reproduces: every recorded trajectory and fingerprint comes back bit for bit.

The ledger is a syrupy snapshot (``snapshot.py``) under ``snapshots/<model-slug>/``: ``--snapshot-update``
records it, a plain run audits against it. The claim's test hands syrupy's ``snapshot`` fixture over.

Least evidence: every recorded unit the run can reach (a recorded unit of an item the run planned but never
computed, a dead worker's, fails the claim), and at least ``min_units`` of them, the exactness claims' 12:
one reproduced unit is no audit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_kvaudit.claims.base import FAIL, INCONCLUSIVE, PASS, Claim, ClaimResult, Evidence, Threshold, register
from pytest_kvaudit.claims.htmlkit import e, section, status, table
from pytest_kvaudit.core.cost import ledger as L
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import EMBEDDED_NAME, EMBEDDED_SNAPSHOTS, AuditConfig


def default_path(snapshots: str | None, model: str) -> Path:
    """Where this claim's suite keeps ``model``'s ledger (``--kvaudit-snapshots`` or
    ``snapshots/``); the embedded checkpoint's falls back to the ledger kvaudit ships."""
    path = L.snapshot_folder(snapshots, model) / "test_ledger_audit" / "test_ledger_audit.json"
    if not path.is_file() and L.slug(model) == EMBEDDED_NAME:
        return EMBEDDED_SNAPSHOTS / "test_ledger_audit" / "test_ledger_audit.json"
    return path


def shipped_ledger(model: str, path: Path) -> Path | None:
    """The ledger kvaudit ships for the embedded checkpoint in ``path``'s place (the package's copy, or in a
    checkout the file committed under snapshots/), if ``model`` is that checkpoint; else None."""
    packaged = EMBEDDED_SNAPSHOTS / path.parent.name / path.name
    return packaged if L.slug(model) == EMBEDDED_NAME and packaged.is_file() else None


@register
class LedgerAudit(Claim):
    name = "ledger_audit"
    exact = True  # lossy cache kinds are skipped, saying so (notes.lossy_note)
    # the ledger holds every construction, the replicas, the 2x2's cells and the donors' all-layer transplants
    needs = ("trajectory", "replicas", "constructions", "fixed", "transplants")
    order = 50
    title = "Ledger audit"
    thresholds = {"min_units": Threshold(12, "least units both recorded and run (the exactness claims' 12)", "units")}
    evidence = ("a ledger recorded for this model and environment, every recorded unit of the run's items computed, "
                "and min_units units both recorded and run")
    inputs = ("snapshot",)

    def recorded_run(self, config: AuditConfig) -> Path | None:
        return default_path(config.snapshots, config.model)

    def judge(self, ev: Evidence) -> ClaimResult:
        from pytest_kvaudit.claims.ledger_snapshot import extension_for

        cfg = ev.config
        snapshot: Any = ev.inputs.get("snapshot")
        if snapshot is None:
            raise KvauditError("ledger_audit needs syrupy's snapshot fixture: kvaudit_judge.claim(snapshot=snapshot)")
        tokens_only = cfg.ledger_tokens_only
        ext = extension_for(L.snapshot_folder(cfg.snapshots, cfg.model), tokens_only)
        snap = snapshot.use_extension(ext)
        path = ext.ledger_path(snap.test_location)
        L.sweep_temporary(path)  # a write that a kill interrupted leaves nothing behind for long
        current = L.build(ev.store)
        missing = list(getattr(ev.store, "missing", []))
        recorded: dict[str, Any] | None = None
        damaged = None
        if path.is_file():
            try:
                recorded = L.read(path)
            except KvauditError as exc:
                damaged = str(exc)

        def keep() -> None:
            # syrupy counts a snapshot no assertion read as unused, fails the run for it and deletes it
            # under --snapshot-update: read the recorded ledger against itself, which writes nothing
            if recorded is not None:
                snap == recorded  # noqa: B015

        if snap.session.update_snapshots:
            return self._record(snap, path, current, recorded, missing, keep)
        shipped = False
        packaged = shipped_ledger(cfg.model, path)
        if recorded is None and damaged is None and packaged is not None:
            # a first run from a wheel: the embedded checkpoint's ledger as kvaudit ships it
            path, shipped, recorded = packaged, True, L.read(packaged)
        #: the ledger is kvaudit's own (read from the package, or, in a checkout, the same committed file)
        ours = packaged is not None and path.is_file() and path.resolve() == packaged.resolve()
        if damaged is not None:
            return self.result(FAIL, 0, 0, damaged)
        if recorded is None:
            return self.result(INCONCLUSIVE, 0, 0,
                               f"no ledger recorded for this model at {path}: record one with --snapshot-update")
        if not shipped:
            keep()
        diffs = L.identity_differences(recorded, current, tokens_only)
        a = L.audit(recorded, current, tokens_only)
        if diffs:
            moved = [f"{u} ({', '.join(f[:2])})" for u, f in a.mismatches.items()]
            units = (f"; {len(moved)}/{a.units} units differ: "
                     f"{'; '.join(moved[:4])}{' and more' if len(moved) > 4 else ''}"
                     if moved else "")
            figs: dict[str, Any] = {"identity_differences": diffs, "ledger": str(path)}
            other_model = any(d.startswith("model.") for d in diffs)
            if ours and not other_model and any(d.startswith("config.") for d in diffs):
                # the ledger kvaudit ships holds the embedded checkpoint's default run: a run with other settings
                # (another item set, say) has nothing of its own to audit yet, which is no fault of the checkpoint
                return self.result(INCONCLUSIVE, a.units, a.reproduced, f"the ledger kvaudit ships ({path}) was "
                                   f"recorded for the default settings, not this run's: {'; '.join(diffs)}; record "
                                   "one for these settings with --snapshot-update (or --kvaudit-snapshots=DIR)", figs)
            if any(d.startswith(("model.", "config.")) for d in diffs):
                whom = "another model" if other_model else "other settings"
                return self.result(FAIL, a.units, a.reproduced, f"ledger {path} was recorded for {whom}: "
                                   f"{'; '.join(diffs)}; record a ledger for this checkpoint with --snapshot-update "
                                   f"(or --kvaudit-snapshots=DIR){units}", figs, list(a.mismatches))
            # Another CPU, GPU or library version computes other bits without the checkpoint being at fault:
            # no verdict on bits here (--kvaudit-strict makes this a failure). What can still be compared across
            # environments, the token ids of every trajectory and suffix, is counted beside it.
            figs["token_level"] = tl = L.token_level(recorded, current)
            tokens = "; ".join(f"{d}: {c['trajectories_reproduced']}/{c['units']} trajectories and "
                               f"{c['suffixes_reproduced']}/{c['suffixes']} suffixes token for token"
                               for d, c in tl.items())
            return self.result(INCONCLUSIVE, a.units, a.reproduced,
                               f"ledger {path} was recorded in another environment "
                               f"({'; '.join(diffs)}), so its bits cannot be audited here: re-record it here with "
                               f"--snapshot-update, or audit the token-level fields with --kvaudit-ledger-tokens-only"
                               f"{units}; token level, comparable across environments: {tokens or 'no unit in common'}",
                               figs)
        figs = {"reproduced": a.reproduced, "units": a.units, "not_recorded": len(a.not_recorded), "not_run": a.not_run,
                "tokens_only": tokens_only, "ledger": str(path)}
        if a.mismatches:
            bad = [f"{u} ({', '.join(f[:3])}{'...' if len(f) > 3 else ''})" for u, f in a.mismatches.items()]
            return self.result(FAIL, a.units, a.reproduced, f"{len(bad)}/{a.units} units not reproduced: "
                               f"{'; '.join(bad[:6])}{' and more' if len(bad) > 6 else ''}", figs, bad)
        unreached = sorted(u for u in recorded["units"] if u.rsplit("@", 1)[0] in set(missing))
        if unreached:  # planned, never computed: not a pass
            return self.result(FAIL, a.units, a.reproduced, f"{len(unreached)} recorded units were planned and never "
                               f"computed (a worker died or the run was cut short): {', '.join(unreached[:6])}", figs,
                               unreached)
        if a.units < ev.thresholds["min_units"]:
            return self.result(INCONCLUSIVE, a.units, a.reproduced,
                               f"{a.units} units both recorded and run, needs {int(ev.thresholds['min_units'])}", figs)
        extra = (f"; {len(a.not_recorded)} units of this run are not in the ledger (a larger run than recorded: "
                 "--snapshot-update records them)" if a.not_recorded else "")
        return self.result(PASS, a.units, a.reproduced, f"all {a.units} recorded units reproduced"
                           f"{' (token-level fields)' if tokens_only else ' (ids, labels and every fingerprint)'}"
                           f"{' against the ledger kvaudit ships' if shipped else ''}{extra}", figs)

    def _record(self, snap: Any, path: Path, current: dict[str, Any], recorded: dict[str, Any] | None,
                missing: list[str], keep: Any) -> ClaimResult:
        """``--snapshot-update``: the ledger is replaced whole, and only by a complete run over at least the
        units it holds; otherwise the recorded ledger stays exactly as it was, and the claim fails saying why."""
        if missing:
            keep()
            return self.result(FAIL, 0, 0, f"ledger not recorded: {len(missing)} items were never computed (a worker "
                               f"died or the run was cut short): {', '.join(missing[:6])}; {path} is kept as it was")
        if recorded is not None:
            dropped = sorted(set(recorded["units"]) - set(current["units"]))
            if dropped:
                keep()
                return self.result(FAIL, 0, 0, f"ledger not recorded: {path} holds {len(recorded['units'])} units and "
                                   f"this run {len(current['units'])} ({len(dropped)} recorded units would be lost, "
                                   f"e.g. {', '.join(dropped[:3])}): --snapshot-update replaces a ledger only from a "
                                   "run over all its units (the same --kvaudit-n or more), or delete it first")
        assert snap == current  # syrupy writes it (atomically, see snapshot.py) when it differs
        return self.result(INCONCLUSIVE, 0, 0, f"ledger of {len(current['units'])} units recorded to {path}; "
                                               "a plain run audits against it",
                           {"recorded": True, "units": len(current["units"]), "ledger": str(path)})

    def rejudge(self, result: Any, thresholds: Any) -> ClaimResult | None:
        """A recorded pass on fewer than ``min_units`` units (a report from before the least evidence) is
        inconclusive today; any other verdict stands."""
        if result["status"] != PASS or result["n"] >= thresholds["min_units"]:
            return None
        return self.result(INCONCLUSIVE, result["n"], result["k"],
                           f"{result['n']} units both recorded and run, needs {int(thresholds['min_units'])}",
                           result.get("figures"), result.get("counterexamples"))

    def comparable(self, result: ClaimResult) -> bool:
        # a run that recorded its ledger, or found none to audit, says nothing of the checkpoint: a gate's
        # "inconclusive -> pass" here would only say that the ledger now exists
        return not result.figures.get("recorded") and result.n > 0

    def html(self, result: Any, run: Any) -> str | None:
        return section(self.name, self.title, table(["verdict", "k/n", "reason"], [
            [status(result["status"]), f"{result['k']}/{result['n']}", e(result["reason"])]]))
