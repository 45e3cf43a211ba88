"""Ledger lifecycle as pytest-regressions tests it: record -> pass -> change -> fail -> update -> pass,
also under -n 2; refusals for another model or environment; atomic writes; broken files named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtest import REPO, flat
from pytest_kvaudit.core.atomic import atomic_write_text
from pytest_kvaudit.core.cost.ledger import parse
from pytest_kvaudit.core.errors import KvauditError

LEDGER = "snapshots/{slug}/test_ledger_audit/test_ledger_audit.json"


def setup(pytester: pytest.Pytester, recorded: Path | None = None) -> None:
    """The ledger claim's file in the test's folder, and with ``recorded`` the ledger recorded once for this module
    (as a checkout holds a committed one)."""
    shutil.copy(REPO / "suites" / "test_ledger_audit.py", pytester.path)
    if recorded is not None:
        shutil.copytree(recorded, pytester.path / "snapshots")


@pytest.fixture(scope="module")
def recorded(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint's ledger at n=6, recorded once (per worker) by a ``--snapshot-update`` run like
    :func:`run`'s, for the tests that start from a recorded ledger: recording it in each of them cost CI a run
    apiece. ``test_record_audit_change_update`` records its own, since recording is what it tests."""
    home = tmp_path_factory.mktemp("recorded")
    shutil.copy(REPO / "suites" / "test_ledger_audit.py", home)
    env = dict(os.environ, PYTEST_ADDOPTS="--kvaudit-claims=none")
    res = subprocess.run([sys.executable, "-m", "pytest", f"--kvaudit-model={tiny_llama}", "--kvaudit-n=6",
                          f"--kvaudit-report={home / 'r.json'}", "--snapshot-update", "-p", "no:cacheprovider"],
                         cwd=home, env=env, capture_output=True, text=True, timeout=600)
    ledger = home / LEDGER.format(slug=tiny_llama.name)
    assert ledger.is_file() and "12 units recorded" in res.stdout, res.stdout[-3000:] + res.stderr[-2000:]
    return home / "snapshots"


def run(pytester: pytest.Pytester, ckpt: Path, *args: str) -> tuple[pytest.RunResult, dict]:
    rep = pytester.path / "r.json"
    if rep.exists():
        rep.unlink()
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ckpt}", "--kvaudit-n=6", f"--kvaudit-report={rep}",
                                        "-p", "no:cacheprovider", "-rs", *args)
    return res, (json.loads(rep.read_text())["claims"]["ledger_audit"] if rep.exists() else {})


NOISE = """
import torch
from pytest_kvaudit.core.runtime.decoder import Faults
def hook(logits, path):
    return logits + 1e-3 if path == "prefill" and logits.dtype == torch.float32 else logits
def pytest_kvaudit_faults(config):
    return Faults(logits=hook)

"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_record_audit_change_update(pytester: pytest.Pytester, tiny_llama: Path, xdist: list[str]) -> None:
    """The ledger's life: nothing recorded, recorded, audited, a changed computation failing and writing nothing,
    updated. Under ``-n 2`` the steps where the workers' records meet in the controller (record, audit, a failing
    audit) run again; the first and the update are the same code path under xdist (two runs fewer)."""
    setup(pytester)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    if not xdist:
        res, c = run(pytester, tiny_llama)
        res.assert_outcomes(skipped=1)
        assert c["status"] == "inconclusive" and "record one with --snapshot-update" in c["reason"]

    res, c = run(pytester, tiny_llama, "--snapshot-update", *xdist)
    assert path.is_file() and c["status"] == "inconclusive" and "12 units recorded" in c["reason"]
    recorded = path.read_text()

    res, c = run(pytester, tiny_llama, *xdist)
    res.assert_outcomes(passed=1)
    assert (c["status"], c["k"], c["n"]) == ("pass", 12, 12)

    pytester.makeconftest(NOISE)  # the computation changes: fp32 prefill logits move
    res, c = run(pytester, tiny_llama, *xdist)
    res.assert_outcomes(failed=1)
    assert c["status"] == "fail" and c["k"] == 6 and c["n"] == 12
    res.stdout.fnmatch_lines(["*ledger_audit FAILED: 6/12 units not reproduced: t00@fp32 (comparison_fp, "
                              "constructions.prefill.logits_fp*"])
    assert path.read_text() == recorded  # a failing audit writes nothing
    if xdist:
        return
    res, c = run(pytester, tiny_llama, "--snapshot-update")
    assert path.read_text() != recorded
    res, c = run(pytester, tiny_llama)
    res.assert_outcomes(passed=1)


def test_a_smaller_run_audits_a_subset(pytester: pytest.Pytester, tiny_llama: Path, recorded: Path) -> None:
    setup(pytester, recorded)
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=3", "-p", "no:cacheprovider")
    res.assert_outcomes(skipped=1)  # 6 units reproduced, fewer than the exactness claims' 12: no audit yet
    res.stdout.fnmatch_lines(["*ledger_audit*INCONCLUSIVE*"])
    assert "6 units both recorded and run, needs 12" in flat(res.stdout.str()), res.stdout.str()
    pytester.makeini("[pytest]\nkvaudit_thresholds = ledger_audit.min_units=6\n")
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=3", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*ledger_audit*PASS*6*6*"])


def test_a_smaller_update_keeps_the_larger_ledger_whole(pytester: pytest.Pytester, tiny_llama: Path,
                                                        recorded: Path) -> None:
    """The rule: --snapshot-update replaces a ledger only from a complete run over at least its units."""
    setup(pytester, recorded)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    report = path.parent.parent / "report.json"
    before, report_before = path.read_bytes(), report.read_bytes()
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=3", "--snapshot-update",
                                        "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*ledger_audit FAILED: ledger not recorded: * holds 12 units and this run 6 (6 recorded "
                              "units would be lost, e.g. t03@bf16, *): --snapshot-update replaces a ledger only from a "
                              "run over all its units*"])
    assert path.read_bytes() == before and report.read_bytes() == report_before


def test_a_larger_run_audits_what_was_recorded_and_says_the_rest(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup(pytester)
    pytester.makeini("[pytest]\nkvaudit_thresholds = ledger_audit.min_units=6\n")  # 3 items recorded: 6 units
    pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=3", "--snapshot-update",
                                  "-p", "no:cacheprovider")
    res, c = run(pytester, tiny_llama)
    res.assert_outcomes(passed=1)
    assert (c["k"], c["n"], c["figures"]["not_recorded"]) == (6, 6, 6)
    res.stdout.fnmatch_lines(["*kvaudit claims*"])
    assert "6 units of this run are not in the ledger" in flat(res.stdout.str()), res.stdout.str()


@pytest.mark.parametrize("damage", ["empty-units", "not-utf8"])
def test_a_damaged_ledger_is_one_line_naming_it(pytester: pytest.Pytester, tiny_llama: Path,
                                                recorded: Path, damage: str) -> None:
    setup(pytester, recorded)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    if damage == "empty-units":
        doc = json.loads(path.read_text())
        doc["units"] = {}
        path.write_text(json.dumps(doc))
        line = f"*ledger_audit FAILED: ledger {path} holds no units: re-record it with --snapshot-update*"
    else:
        path.write_bytes(b"\xff\xfe" + path.read_bytes())
        line = f"*ledger_audit FAILED: ledger {path} is not UTF-8 text*"
    res, c = run(pytester, tiny_llama)
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines([line])
    res.stdout.no_fnmatch_line("*Traceback*")


CRASH_SHARD_1 = """
import os
from pytest_kvaudit.core.compute.cells import CellBuilder
_compute = CellBuilder.compute
def compute(self, item, *a):
    if item.id == os.environ.get("KVAUDIT_TEST_CRASH_AT"):
        os._exit(3)
    return _compute(self, item, *a)
CellBuilder.compute = compute
"""


@pytest.mark.parametrize("crash_at", ["t01", "t05"])
def test_a_worker_killed_during_an_update_records_nothing(pytester: pytest.Pytester, tiny_llama: Path, recorded: Path,
                                                          monkeypatch: pytest.MonkeyPatch, crash_at: str) -> None:
    setup(pytester, recorded)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    before = path.read_bytes()
    pytester.makeconftest(NOISE + CRASH_SHARD_1)  # the update would record another ledger, and loses a worker
    monkeypatch.setenv("KVAUDIT_TEST_CRASH_AT", crash_at)
    res, c = run(pytester, tiny_llama, "--snapshot-update", "-n", "2")
    assert res.ret != 0
    assert path.read_bytes() == before
    if c:  # the claim ran on the surviving worker: it says why nothing was recorded
        assert c["status"] == "fail" and "ledger not recorded: " in c["reason"]
    monkeypatch.delenv("KVAUDIT_TEST_CRASH_AT")
    res, c = run(pytester, tiny_llama, "-n", "2")  # a plain audit of a run that loses a worker never passes
    monkeypatch.setenv("KVAUDIT_TEST_CRASH_AT", crash_at)
    res, c = run(pytester, tiny_llama, "-n", "2")
    assert res.ret != 0 and c.get("status") != "pass"


def test_another_model_is_refused_naming_what_differs(pytester: pytest.Pytester, tiny_llama: Path, recorded: Path,
                                                      tmp_path: Path) -> None:
    setup(pytester, recorded)
    other = tmp_path / tiny_llama.name  # same folder name, so the same ledger slug, other weights
    from pytest_kvaudit.testing import tiny_checkpoint

    tiny_checkpoint(other, "llama", seed=7, n_items=14)
    res, c = run(pytester, other)
    res.assert_outcomes(failed=1)
    assert c["status"] == "fail"
    res.stdout.fnmatch_lines(["*was recorded for another model: model.weights_digest recorded 'sha256:*', now "
                              "'sha256:*'; record a ledger for this checkpoint with --snapshot-update*units differ: "
                              "t00@bf16*"])


def test_another_environment_is_inconclusive_unless_tokens_only(pytester: pytest.Pytester, tiny_llama: Path,
                                                                recorded: Path) -> None:
    setup(pytester, recorded)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    doc = json.loads(path.read_text())
    doc["environment"]["torch"] = "1.0.0"
    for u in doc["units"].values():  # another machine: the same tokens, other bits
        u["comparison_fp"] = "0" * 32
        for c in u["constructions"].values():
            c["state_fp"] = "0" * 32
    path.write_text(json.dumps(doc))
    res, c = run(pytester, tiny_llama)
    res.assert_outcomes(skipped=1)  # not the checkpoint's fault: no verdict on bits, and both ways forward named
    assert c["status"] == "inconclusive" and c["figures"]["identity_differences"][0].startswith("environment.torch")
    # what can be compared across environments is, beside the verdict: every trajectory and suffix, token for token
    tl = c["figures"]["token_level"]
    assert tl and all(x["trajectories_reproduced"] == x["units"] > 0 and x["suffixes_reproduced"] == x["suffixes"] > 0
                      for x in tl.values())
    res.stdout.fnmatch_lines(["*token level, comparable across environments: *trajectories and *suffixes token for "
                              "token*"])
    res.stdout.fnmatch_lines(["*recorded in another environment (environment.torch recorded '1.0.0', now '*'), so its "
                              "bits cannot be audited here: re-record it here with --snapshot-update, or audit the "
                              "token-level fields with --kvaudit-ledger-tokens-only*"])
    res, c = run(pytester, tiny_llama, "--kvaudit-strict")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*ledger_audit inconclusive under --kvaudit-strict: *recorded in another environment*"])
    res, c = run(pytester, tiny_llama, "--kvaudit-ledger-tokens-only")
    res.assert_outcomes(passed=1)
    assert c["figures"]["tokens_only"] is True
    name, unit = next(iter(doc["units"].items()))  # one suffix moved: the token-level count says so
    c0 = unit["constructions"]["prefill"]
    c0["suffix"] = " ".join(["7"] * max(1, len(c0["suffix"].split())))
    path.write_text(json.dumps(doc))
    res, c = run(pytester, tiny_llama)
    d = c["figures"]["token_level"][name.rsplit("@", 1)[1]]
    assert d["suffixes_reproduced"] == d["suffixes"] - 1 and d["units_reproduced"] == d["units"] - 1


def test_truncated_ledger_is_named(pytester: pytest.Pytester, tiny_llama: Path, recorded: Path) -> None:
    setup(pytester, recorded)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    res, c = run(pytester, tiny_llama)
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines([f"*ledger {path} is not valid JSON (line *): truncated or edited by hand?*"])


def test_an_interrupted_update_leaves_the_old_ledger_whole(pytester: pytest.Pytester, tiny_llama: Path,
                                                           recorded: Path) -> None:
    setup(pytester, recorded)
    path = pytester.path / LEDGER.format(slug=tiny_llama.name)
    before = path.read_bytes()
    # the update computes a different ledger, then dies in the middle of writing it
    crash = NOISE + (
        "import os\n"
        "def dying_replace(src, dst):\n"
        "    os._exit(9)\n"
        "os.replace = dying_replace\n"
    )
    pytester.makeconftest(crash)
    res, _ = run(pytester, tiny_llama, "--snapshot-update")
    assert res.ret == 9
    assert path.read_bytes() == before
    # a hard kill can leave the hidden temporary file, never a half-written ledger in its place
    assert all(p.name.startswith(".test_ledger_audit.json.") for p in path.parent.iterdir() if p != path)
    pytester.makeconftest("")
    res, c = run(pytester, tiny_llama)
    res.assert_outcomes(passed=1)
    assert list(path.parent.iterdir()) == [path]  # the next run swept what the kill left behind


def test_atomic_write_cleans_up_on_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "ledger.json"
    target.write_text("old")

    def boom(*a: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        atomic_write_text(target, "new")
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]


@pytest.mark.parametrize("text", ["", "{", "[]", '{"kvaudit_ledger": 1}', '{"kvaudit_ledger": 1, "units": {"a": 3}, '
                                  '"model": {}, "environment": {}, "config": {}}'])
def test_broken_ledgers_are_one_line_errors(text: str) -> None:
    with pytest.raises(KvauditError) as exc:
        parse(text, "snapshots/x/l.json")
    assert "snapshots/x/l.json" in str(exc.value) and "\n" not in str(exc.value)




@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.recursive(st.none() | st.integers() | st.text(max_size=5),
                                             lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                                 st.sampled_from(["kvaudit_ledger", "units", "model", "environment",
                                                                  "config", "generated"]), c, max_size=6),
                                             max_leaves=10).map(json.dumps))
def test_fuzz_ledger_parser_raises_only_our_error(text: str) -> None:
    try:
        parse(text, "fuzz.json")
    except KvauditError:
        pass


def test_a_checkpoint_file_keeps_its_ledger_under_its_own_name(tmp_path: Path) -> None:
    from pytest_kvaudit.core.cost.ledger import slug

    f = tmp_path / "models" / "Smol LM.Q4_1.gguf"
    f.parent.mkdir()
    f.write_bytes(b"GGUF")
    assert slug(str(f)) == "Smol-LM.Q4_1.gguf" and slug("org/name") == "org--name"
