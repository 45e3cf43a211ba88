"""``--kvaudit-exact-items=N``: the replicas and the bridge (what replica_exactness and bridge_bitexact read) on
the first N items of the set only. The two claims judge exactly those units and still fail on a broken replica
or bridge; every other claim reads every item; the plan prices it, the run costs what the plan's model says,
and a ledger recorded with it is another run's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtest import LOW_BARS, REPO, faults, run, setup_suite
from pytest_kvaudit.core.cost.evidence import caps, evidence
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import constructions, exact_steps, replicates

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

NOISE = "lambda x, path: x + 1e-3 if path == '{}' else x"


def _index(item_id: str) -> int:
    """The place in the set of a tiny checkpoint's item (``t07``)."""
    return int(item_id[1:])


def test_past_the_head_a_cell_has_no_replica_and_no_bridge() -> None:
    cfg = AuditConfig(exact_items=2, chunks=(4,))
    head = [s.name for s in constructions(cfg, 1)]
    tail = [s.name for s in constructions(cfg, 2)]
    assert head == ["prefill", "prefill:replica", "incremental", "chunked(4)"]
    assert tail == ["prefill", "chunked(4)"]  # every other construction still runs on every item
    assert replicates(cfg, 1) and not replicates(cfg, 2)
    assert exact_steps(cfg) == ("live:replica", "prefill:replica", "incremental")
    every = AuditConfig(chunks=(4,))
    assert [s.name for s in constructions(every, 10**6)] == head and replicates(every, 10**6)
    # a run whose claims read no replica computes none, on any item
    assert not replicates(AuditConfig(exact_items=2, work=("prefill", "trajectory")), 0)


def test_the_evidence_of_the_exact_claims_stops_at_the_head() -> None:
    cfg = AuditConfig(exact_items=5, dtypes=("bf16", "fp32"))
    have = evidence(cfg, 200, {})
    assert have["replica_pairs"][0] == 2 * 5 * 2 and have["items_x_precisions"][0] == 5 * 2
    assert have["units_per_high_precision"][0] == 200  # the 2x2 still reads every item
    assert caps(cfg)["replica_pairs"] == 20 and "replica_pairs" not in caps(AuditConfig())


def test_the_exact_claims_judge_the_head_and_the_rest_every_item(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, every = run(pytester, tiny_llama, "--kvaudit-claims=all")
    assert res.ret in (0, 1), res.stdout.str()[-3000:]
    res, head = run(pytester, tiny_llama, "--kvaudit-claims=all", "--kvaudit-exact-items=3", "-n", "2")
    assert res.ret in (0, 1), res.stdout.str()[-3000:]
    res.stdout.fnmatch_lines(["kvaudit: replicas and the bridge on the first 3 items of the set "
                              "(--kvaudit-exact-items)*"])
    c = head["claims"]
    units = every["claims"]["bridge_bitexact"]["n"] // 8 * 3  # (item, precision) units of the first 3 items
    assert c["bridge_bitexact"]["n"] == units and c["replica_exactness"]["n"] == 2 * units
    assert "on the first 3 items of the set: --kvaudit-exact-items" in c["bridge_bitexact"]["reason"]
    for name in ("matched_construction", "fixed_prefix_2x2", "donor_following"):  # every item, as before
        assert c[name]["n"] == every["claims"][name]["n"], name
    assert head["cost"]["forward_tokens"] < every["cost"]["forward_tokens"]
    # the model of the work stays exact: what the run counted is what its records price
    assert head["cost"]["forward_tokens"] == head["plan"]["priced_after_run"]["forward_tokens"]
    assert head["config"]["identity"]["settings"]["exact_items"] == 3


def test_a_broken_replica_or_bridge_in_the_head_still_fails(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    for path, claim in (("prefill:replica", "replica_exactness"), ("incremental", "bridge_bitexact")):
        setup_suite(pytester,
                    "from pytest_kvaudit.core.runtime.decoder import Faults\n" + faults(logits=NOISE.format(path)),
                    LOW_BARS)
        res, data = run(pytester, tiny_llama, f"--kvaudit-claims={claim}", "--kvaudit-exact-items=3")
        assert res.ret == 1, res.stdout.str()[-3000:]
        assert data["claims"][claim]["status"] == "fail"
        items = {u.split("@")[0] for u in data["claims"][claim]["counterexamples"]}
        assert items and all(_index(i) < 3 for i in items), items  # only the head was computed


def test_a_ledger_recorded_with_a_head_is_another_runs(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makeini(LOW_BARS)
    shutil.copy(REPO / "suites" / "test_ledger_audit.py", pytester.path / "test_ledger_audit.py")
    res, _ = run(pytester, tiny_llama, "--kvaudit-claims=ledger_audit", "--kvaudit-exact-items=3", "--snapshot-update")
    assert res.ret == 0, res.stdout.str()[-3000:]
    ledger = next(pytester.path.glob("snapshots/*/*/*.json"))
    doc = json.loads(ledger.read_text())
    assert doc["config"]["exact_items"] == 3
    assert all(("live:replica" in u["constructions"]) == (_index(k.split("@")[0]) < 3)
               for k, u in doc["units"].items() if u.get("constructions"))
    res, same = run(pytester, tiny_llama, "--kvaudit-claims=ledger_audit", "--kvaudit-exact-items=3")
    assert res.ret == 0 and same["claims"]["ledger_audit"]["status"] == "pass", res.stdout.str()[-3000:]
    res, other = run(pytester, tiny_llama, "--kvaudit-claims=ledger_audit")
    assert res.ret == 1
    reason = other["claims"]["ledger_audit"]["reason"]
    assert "recorded for other settings: config.exact_items recorded 3, now None" in reason
