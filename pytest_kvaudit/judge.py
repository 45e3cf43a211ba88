"""The ``kvaudit_judge`` fixture's object: a claim's verdict becomes the test's outcome.

pass -> the test passes; fail -> it fails naming the counterexamples; inconclusive -> a skip with the
reason. Every verdict is also recorded on the session (and shipped to the xdist controller).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit import verdict_relay as verdicts
from pytest_kvaudit.claims import base as claims
from pytest_kvaudit.claims.notes import lossy_note
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.report.writers import wants_sections
from pytest_kvaudit.session_report import run_info

if TYPE_CHECKING:
    from pytest_kvaudit.core.compute.store import Store
    from pytest_kvaudit.session import KvauditSession

MARKER = "kvaudit_claim"


class Judge:
    """Judge a registered claim (``claim``), an ad-hoc exactness claim (``exact``), or a result (``verdict``)."""

    def __init__(self, session: KvauditSession, node: pytest.Item, store: Store) -> None:
        self.session, self.node, self.store = session, node, store

    def _marker(self) -> Any:
        return self.node.get_closest_marker(MARKER)

    def claim(self, name: str | None = None, **kwargs: Any) -> claims.ClaimResult:
        """Judge the claim ``name`` (default: the test's ``kvaudit_claim`` marker). Keyword arguments are
        threshold overrides, or the inputs that the claim declares (such as ``snapshot``)."""
        marker = self._marker()
        if name is None:
            if marker is None or not marker.args:
                raise pytest.UsageError(f"{self.node.nodeid}: name the claim, kvaudit_judge.claim('NAME'), or mark the "
                                       "test @pytest.mark.kvaudit_claim('NAME')")
            name = str(marker.args[0])
        try:
            claim = claims.get(name)
            inputs = {k: kwargs.pop(k) for k in claim.inputs if k in kwargs}
            mk = marker.kwargs if marker is not None and (not marker.args or marker.args[0] == name) else {}
            th = claim.resolve(self.session.config, mk, self.session.settings.thresholds.get(name, {}), kwargs)
        except KvauditError as exc:
            pytest.fail(str(exc), pytrace=False)
        if (why := claim.applicable(self.store.cfg)) is not None:
            pytest.skip(f"{name} not applicable: {why}")
        ev = claims.Evidence(list(self.store.records.values()), th, self.store.cfg, self.store, inputs)
        result = claim.judge(ev)
        if claim.exact and (note := lossy_note(self.store.cfg)):
            result.reason += note
        if self.store.missing and result.status != claims.FAIL:
            # units the run planned and never got back (a dead worker, a lost shard): no verdict can stand
            lost = self.store.missing
            result.status = claims.FAIL
            result.reason = (f"{len(lost)} items missing (a worker died or the run was cut short): "
                             f"{', '.join(lost[:6])}{' and more' if len(lost) > 6 else ''}; {result.reason}")
            result.counterexamples = [*(f"{i} (missing)" for i in lost), *result.counterexamples]
        return self.verdict(result, claim)

    def exact(self, name: str, units: Mapping[str, bool], min_units: int = 1, reason: str = "") -> claims.ClaimResult:
        """A custom exactness claim: ``units`` maps unit name -> property holds. Fails on one counterexample."""
        return self.verdict(claims.exact_result(name, units, min_units, reason))

    def verdict(self, result: claims.ClaimResult, claim: claims.Claim | None = None) -> claims.ClaimResult:
        """Record ``result`` and turn it into the test's outcome."""
        if claim is None and result.name in {c.name for c in claims.registered()}:
            claim = claims.get(result.name)
        display = claim.display(result) if claim is not None else {
            "order": claims.USER_ORDER, "title": result.name, "figure": result.reason, "rates": {}}
        sess = self.session
        if claim is not None and wants_sections(sess.settings.outputs):
            run = sess.verdicts.run_info or run_info(self.store, sess.config, sess.selected())
            display["html"] = claim.html(result.to_dict(), run)
        verdicts.record(sess.verdicts, result, display, self.node, sess.run_info)
        gate = self.session.gate
        if gate is not None and (why := gate.check_verdict(result, display)) is not None:
            pytest.fail(why, pytrace=False)
        if result.status == claims.FAIL:
            pytest.fail(f"{result.name} FAILED: {result.reason}", pytrace=False)
        if result.status == claims.INCONCLUSIVE:
            if self.session.settings.strict:
                pytest.fail(f"{result.name} inconclusive under --kvaudit-strict: {result.reason}", pytrace=False)
            pytest.skip(f"{result.name} inconclusive: {result.reason}")
        return result
