"""--kvaudit-plan (a plan that computes nothing, and bounds what the run computes) and the static cache as an
axis (--kvaudit-cache=dynamic,static: replay, bridge and transplant on preallocated tensors)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtest import REPO, setup_suite

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

COUNT_COMPUTE = """
import os
from pytest_kvaudit.core.compute.store import Store

_compute = Store.compute


def _counted(self, *a, **k):
    open(os.path.join(os.environ["KVAUDIT_COMPUTE_LOG"], f"compute-{os.getpid()}"), "a").write("x")
    return _compute(self, *a, **k)


Store.compute = _counted
"""


def _run(pytester: pytest.Pytester, ckpt: Path, report: Path, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(f"--kvaudit-model={ckpt}", "--kvaudit-n=8", f"--kvaudit-report={report}",
                                         "-p", "no:cacheprovider", "-rs", *args)


def test_plan_then_run_with_the_static_cache_axis(pytester: pytest.Pytester, tiny_llama: Path,
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One plan and one run of the same config (one pair of subprocess runs, for the 2-core budget): the plan
    prints, exits 0 and computes nothing; its bound holds; the static rows are in the report and exact."""
    setup_suite(pytester, conftest=COUNT_COMPUTE)
    log = tmp_path / "computes"
    log.mkdir()
    monkeypatch.setenv("KVAUDIT_COMPUTE_LOG", str(log))
    planned = _run(pytester, tiny_llama, pytester.path / "plan.json", "--kvaudit-plan",
                   "--kvaudit-cache=dynamic,static")
    assert planned.ret == pytest.ExitCode.OK, planned.stdout.str()
    assert not list(log.iterdir())  # no Store.compute in any process
    planned.assert_outcomes(skipped=7)  # every claim file setup_suite lays out, prefix_cache included
    planned.stdout.fnmatch_lines(["*kvaudit plan (nothing computed beyond the calibration)*",
                                  "*forward tokens: at most*", "*forward tokens predicted:*calibration sample*",
                                  "*no exact prediction: no ledger recorded at*", "*peak K/V cache: bf16*",
                                  "*time on this device: expected*", "bridge_bitexact*decides: yes*"])
    p = json.loads((pytester.path / "plan.json").read_text())["plan"]
    assert p["items"] == 8 and p["precisions"] == ["bf16", "fp32"]
    assert p["cells"]["bf16"]["live"] == 8 and "cache:static" in p["cells"]["fp32"]
    # 2 layers x 2 KV heads x head_dim 8 x positions x 2 bytes x K,V, times the caches alive
    mem = p["memory"]
    assert mem["peak_cache_bytes"]["bf16"] == 2 * 2 * 8 * mem["positions"] * 2 * 2 * mem["caches_alive"]

    ran = _run(pytester, tiny_llama, pytester.path / "run.json", "--kvaudit-cache=dynamic,static")
    report = json.loads((pytester.path / "run.json").read_text())
    assert list(log.iterdir())
    ran.stdout.fnmatch_lines(["plan vs actual: ran * forward tokens; at most * (the plan's bound), * priced from the "
                              "lengths the run produced"])
    assert report["plan"]["forward_tokens_expected"] is None  # a normal run calibrates nothing: no extra trajectory
    after, actual = report["plan"], report["cost"]["forward_tokens"]
    assert p["forward_tokens"] == after["forward_tokens"] >= actual
    assert after["forward_calls"] >= report["cost"]["forward_calls"]
    # the plan's model of the work, on the lengths the run produced, is the run's count token for token
    assert after["priced_after_run"]["forward_tokens"] == actual

    axes = report["analyses"]["axes"]
    assert {r["cache"] for r in axes} == {"dynamic", "static"}
    static = {(r["dtype"], r["construction"]): r for r in axes if r["cache"] == "static"}
    for dtype in ("bf16", "fp32"):
        bridge, tp = static[(dtype, "incremental")], static[(dtype, "transplant:live_to_prefill")]
        assert bridge["n"] == 8 and bridge["state_equals_live"] == 8 and bridge["suffix_equals_live"] == 8
        # the donor's filled positions land in the receiver's preallocated slice, bit for bit, and it follows
        assert tp["state_equals_live"] == 8 and tp["suffix_equals_live"] == 8
        assert static[(dtype, "live")]["suffix_equals_dynamic"] == 8
    assert report["claims"]["bridge_bitexact"]["status"] == "pass"


def test_a_recorded_ledger_predicts_the_run_exactly(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    """Record a ledger; then --kvaudit-plan predicts the next run's forward tokens from its lengths, the run
    ends exactly as predicted and compares its time with the plan's estimate (left in pytest's cache); a
    ledger of another model predicts nothing and says why."""
    setup_suite(pytester)
    shutil.copy(REPO / "suites" / "test_ledger_audit.py", pytester.path)
    args = (f"--kvaudit-model={tiny_llama}", "--kvaudit-n=8", "-rs", "--kvaudit-donor-units=2")
    rec = pytester.runpytest_subprocess(*args, "--snapshot-update")
    assert rec.ret == 0, rec.stdout.str()
    planned = pytester.runpytest_subprocess(*args, "--kvaudit-plan")
    assert planned.ret == 0, planned.stdout.str()
    planned.stdout.fnmatch_lines(["forward tokens predicted: * calls, from the lengths recorded in the ledger "
                                  "*test_ledger_audit.json: exact, a run here reproduces them"])
    report = pytester.path / "run.json"
    ran = pytester.runpytest_subprocess(*args, f"--kvaudit-report={report}")
    assert ran.ret == 0, ran.stdout.str()
    data = json.loads(report.read_text())
    plan, cost = data["plan"], data["cost"]
    assert plan["ledger"]["exact"] and plan["forward_tokens_predicted"] == cost["forward_tokens"]
    assert plan["estimate"]["seconds_expected"] > 0 and plan["estimate"]["workers"] == 1
    ran.stdout.fnmatch_lines(["plan vs actual: ran * forward tokens, predicted * from the ledger "
                              "snapshots/*/test_ledger_audit/test_ledger_audit.json (exact); at most * "
                              "--kvaudit-plan estimated *s with 1 worker(s), the computation took *s (*x)"])

    path = pytester.path / "snapshots" / tiny_llama.name / "test_ledger_audit" / "test_ledger_audit.json"
    doc = json.loads(path.read_text())
    doc["model"]["weights_digest"] = "sha256:another"
    path.write_text(json.dumps(doc))
    other = pytester.runpytest_subprocess(*args, "--kvaudit-plan")
    other.stdout.fnmatch_lines(["*no exact prediction: the ledger at * was recorded for another model or settings: "
                                "model.weights_digest recorded 'sha256:another'*"])


def test_static_adapter_covers_filled_positions_only(tiny_llama: Path) -> None:
    """Fingerprints, comparisons and transplants see a static layer's filled positions, not its preallocation."""
    import torch

    from pytest_kvaudit.core.model.engine_protocol import OpenSpec
    from pytest_kvaudit.core.runtime import state as kv
    from pytest_kvaudit.core.runtime.decoder import Decoder
    from pytest_kvaudit.engines.transformers.backend import open_spec

    torch.set_num_threads(1)
    h = open_spec(OpenSpec(str(tiny_llama), "fp32", "cpu"))
    ids = [3, 4, 5, 6, 7, 8, 9]
    static = Decoder(h, h.eos_ids, cache_kind="static", max_cache_len=32)
    replay = static.build_state(ids, [4, 1, 1, 1])
    again = static.build_state(ids, [4, 1, 1, 1])
    assert [tuple(k.shape) for k, _ in kv.layer_kv(replay)] == [(1, 2, 7, 8)] * 2
    assert kv.fingerprint(replay) == kv.fingerprint(again) and kv.equal(replay, again)
    one_shot = static.build_state(ids, [7])
    moved = kv.transplant(one_shot, replay)
    assert kv.fingerprint(moved) == kv.fingerprint(replay)
    # the receiver keeps its preallocated tensors (torch.compile relies on their addresses)
    assert moved.layers[0].keys.shape[-2] == 32
    # a dynamic donor into a static receiver, and back
    dyn = Decoder(h, h.eos_ids).build_state(ids, [4, 1, 1, 1])
    assert kv.fingerprint(kv.transplant(one_shot, dyn)) == kv.fingerprint(dyn)
    assert kv.fingerprint(kv.transplant(dyn, replay)) == kv.fingerprint(replay)


def test_cache_option_rejects_unknown_layouts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    res = pytester.runpytest_subprocess("--kvaudit-cache=dynamic,paged", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: --kvaudit-cache='dynamic,paged': use a comma list of dynamic and static*"])
