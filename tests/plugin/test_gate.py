"""The checkpoint gate (``--kvaudit-baseline``) as a user meets it: a baseline that cannot gate the run is refused
before anything loads; a checkpoint whose trajectories moved fails ``kvaudit::baseline`` with a diff, under
xdist too; less divergence is an improvement, more a regression; the rules themselves, on plain data."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.gate.identity import mismatches
from pytest_kvaudit.core.gate.ledger_diff import compare, findings, with_text
from pytest_kvaudit.core.gate.rules import Rules
from pytest_kvaudit.core.model.config import EMBEDDED_DIR
from pytest_kvaudit.report.comparison import compare as compare_reports
from pytest_kvaudit.report.comparison import compare_lines, ledger_lines
from pytest_kvaudit.report.html import gate_banner

N = "--kvaudit-n=8"
BF16 = "--kvaudit-dtypes=bf16"
LEDGER = Path("test_ledger_audit") / "test_ledger_audit.json"


# -- the rules and the comparison, on plain data --------------------------------------------------
def test_rules_grammar_and_one_sided_defaults() -> None:
    r = Rules.parse(None)
    assert r.judge("divergence", 5, 6) == "regression" and r.judge("divergence", 5, 4) == "improvement"
    assert r.judge("divergence", 5, 5, changed=True) == "change"  # reported, not failed
    assert r.judge("trajectories", 0, 1) == "regression" and r.judge("trajectories", 0, 0) is None
    assert r.verdict("pass", "inconclusive") == "regression" and r.verdict("inconclusive", "pass") == "improvement"
    assert Rules.parse("divergence:change").judge("divergence", 5, 5, changed=True) == "regression"
    assert Rules.parse("none").judge("divergence", 1, 9) == "change"
    for bad, says in (("divergence:up", "'divergence:up' is not a rule"), ("speed:increase", "is not a rule"),
                      ("labels:increase,labels:change", "labels is named twice"), ("", "is empty")):
        with pytest.raises(KvauditError, match=says) as e:
            Rules.parse(bad)
        assert "\n" not in str(e.value)


def unit(live: str, prefill: str, generated: str = "1 2 3", live_label: bool = True, pre_label: bool = True) -> dict:
    return {"generated": generated, "prompt_ids_digest": "p", "boundary": 1, "reason": None,
            "constructions": {"live": {"suffix": live, "label": live_label},
                              "prefill": {"suffix": prefill, "label": pre_label}}}


def test_a_changed_divergent_set_at_an_equal_count_is_named() -> None:
    was = {"units": {"sum-004@bf16": unit("1 2", "1 3"), "sum-009@bf16": unit("1 2", "1 2")}}
    now = {"units": {"sum-004@bf16": unit("1 2", "1 2"), "sum-009@bf16": unit("1 2", "1 4", generated="1 2 7")}}
    diff = compare(was, now)["bf16"]
    assert diff["divergence"] == {"was": [1, 2], "now": [1, 2], "left": ["sum-004"], "joined": ["sum-009"]}
    assert diff["trajectories"]["items"] == [{"item": "sum-009", "position": 2, "was": 3, "now": 7,
                                              "was_ids": [1, 2, 3], "now_ids": [1, 2, 7]}]
    found = {f["metric"]: f["kind"] for f in findings(compare(was, now), Rules.parse(None))}
    # sum-004's prefill continuation moved while its trajectory held: reported as a change
    assert found == {"divergence": "change", "trajectories": "regression", "continuations": "change"}
    found = {f["metric"]: f["kind"] for f in findings(compare(was, now), Rules.parse("divergence:change"))}
    assert found == {"divergence": "regression", "trajectories": "change",
                     "continuations": "change"}  # a rule not named reports only


def test_a_continuation_that_moves_while_its_item_stays_divergent_is_reported() -> None:
    was = {"units": {"sum-004@bf16": unit("1 2", "1 3 5")}}
    now = {"units": {"sum-004@bf16": unit("1 2", "1 3 6")}}  # still divergent, same count, same trajectory
    diff = compare(was, now)
    t = diff["bf16"]["trajectories"]
    assert t["changed"] == 0 and t["continuations_changed"] == 1
    assert t["continuations"][0] | {"was_ids": None, "now_ids": None} == {
        "item": "sum-004", "construction": "prefill", "position": 2, "was": 5, "now": 6, "was_ids": None,
        "now_ids": None}
    found = findings(diff, Rules.parse(None))
    assert [(f["metric"], f["kind"], f["changed"]) for f in found] == [("continuations", "change", 1)]  # reported
    failing = findings(diff, Rules.parse("continuations:change"))
    assert [(f["metric"], f["kind"]) for f in failing] == [("continuations", "regression")]  # when asked for
    text = with_text(diff, lambda d, ids: "".join(chr(ord("a") + i) for i in ids))
    lines = ledger_lines({"precisions": text, "findings": failing})
    assert "REGRESSION bf16 continuations: 1 changed token for token where the trajectory held" in lines
    assert "  sum-004@bf16 prefill from token 2: baseline id 5, this run id 6" in lines
    assert "    baseline: 'bdf' (ids 1 3 5)" in lines and "    this run: 'bdg' (ids 1 3 6)" in lines


def test_an_unset_setting_is_its_default() -> None:
    base = {"model": {}, "items": {}, "settings": {"threads": None, "attn": None}}
    run_ = {"model": {}, "items": {}, "settings": {"threads": 1, "attn": "sdpa"}}
    assert mismatches(base, run_, {"attn": "sdpa"}) == []  # the baseline's attention resolved to sdpa
    assert mismatches(base, run_, {"attn": "eager"}) == ["settings.attn: baseline None, this run 'sdpa'"]
    run_["settings"]["threads"] = 2
    assert [m.split(":")[0] for m in mismatches(base, run_, {"attn": "sdpa"})] == ["settings.threads"]


def test_the_gates_sentences_are_whole_and_counted_in_the_singular() -> None:
    base = report({"bridge_bitexact": ("inconclusive", 4, {})})
    now = report({"bridge_bitexact": ("pass", 12, {})})
    lines = compare_lines(compare_reports(base, now, Rules.parse(None)))
    assert lines[0].endswith(": 0 regressions and 1 improvement.")
    assert "Trajectories were not compared, because the kvaudit::baseline test did not run." in lines
    assert not any(line == "No change from the baseline." for line in lines)  # nothing was compared to say so
    banner = gate_banner({"path": "b", "regressions": 1, "improvements": 1, "ledger": {}})
    assert "FAILED</span>: 1 regression, 1 improvement." in banner


def test_identity_mismatches_name_the_field_and_leave_the_weights_out() -> None:
    ident = {"model": {"architecture": "Qwen2ForCausalLM", "num_layers": 4},
             "items": {"set": "a.jsonl", "count": 24, "digest": "sha256:aa"}, "settings": {"dtypes": ["bf16"]}}
    other = json.loads(json.dumps(ident))
    assert mismatches(ident, other) == []
    other["items"]["count"] = 32
    assert mismatches(ident, other) == ["n (items): baseline 24, this run 32 (--kvaudit-n)"]
    other["items"].update(count=24, digest="sha256:bb", set="b.jsonl")
    other["model"]["num_layers"] = 6
    assert [m.split(":")[0] for m in mismatches(ident, other)] == ["model.num_layers", "items"]


def report(claims: dict[str, tuple[str, int, dict]]) -> dict:
    return {"model": {}, "claims": {n: {"name": n, "status": s, "n": k, "k": k, "reason": "", "interval": [None, None],
                                        "figures": f, "counterexamples": [], "details": []}
                                    for n, (s, k, f) in claims.items()}}


def test_a_recorded_ledger_is_no_change_and_a_better_verdict_is_an_improvement() -> None:
    base = report({"ledger_audit": ("inconclusive", 0, {"recorded": True}), "bridge_bitexact": ("inconclusive", 4, {})})
    now = report({"ledger_audit": ("pass", 8, {}), "bridge_bitexact": ("pass", 12, {})})
    cmp = compare_reports(base, now, Rules.parse(None))
    assert cmp["claims"]["ledger_audit"]["kind"] == "not_compared"
    assert [c["claim"] for c in cmp["changes"]] == ["bridge_bitexact"] and cmp["regressions"] == 0
    lines = compare_lines(cmp)
    assert "improvement bridge_bitexact: inconclusive -> pass" in lines
    assert not any("ledger_audit" in line for line in lines)


# -- as a user runs it ----------------------------------------------------------------------------
def run(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}  # the built-in claims join, as for a user
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rfs", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last checkpoint's ledger and verdicts, as the README's CI recipe records them (8 items, BF16)."""
    root = tmp_path_factory.mktemp("gate")
    shutil.copytree(EMBEDDED_DIR, root / "step-1000")
    res = run(root, "--kvaudit-model=step-1000", N, BF16, "--snapshot-update")
    assert res.returncode == 0, res.stdout[-3000:]
    assert (root / "snapshots" / "step-1000" / LEDGER).is_file()
    return root


def perturbed(dest: Path, layer: int = 1, scale: float = 1e-3) -> Path:
    """The embedded checkpoint with every weight of one layer multiplied by (1 + scale * noise)."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(EMBEDDED_DIR, dest)
    w = load_file(str(dest / "model.safetensors"))
    gen = torch.Generator().manual_seed(0)
    for k in [k for k in w if f".layers.{layer}." in k]:
        w[k] = (w[k].float() * (1 + scale * torch.randn(w[k].shape, generator=gen))).to(w[k].dtype)
    save_file(w, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


@pytest.mark.slow  # runs the audit on perturbed checkpoints
def test_a_checkpoint_perturbed_by_1e_3_in_one_layer_fails_kvaudit_baseline_under_xdist(
        recorded: Path, tmp_path: Path) -> None:
    ckpt = perturbed(tmp_path / "next" / "step-2000")
    rep = tmp_path / "r.json"
    res = run(tmp_path, f"--kvaudit-model={ckpt}", N, BF16, "-n", "2", f"--kvaudit-report={rep}",
              f"--kvaudit-baseline={recorded / 'snapshots' / 'step-1000'}")
    out = res.stdout
    assert res.returncode == 1, out[-4000:]
    assert "FAILED kvaudit::baseline" in out and " 1 failed" in out, out[-3000:]
    data = json.loads(rep.read_text())["baseline"]
    traj = data["ledger"]["precisions"]["bf16"]["trajectories"]
    assert traj["changed"] > 0 and traj["compared"] == 8
    assert {"metric": "trajectories", "dtype": "bf16", "kind": "regression", "changed": traj["changed"],
            "compared": 8} in data["ledger"]["findings"]
    assert traj["continuations_changed"] == 0  # every moved item's trajectory moved: counted there, not twice
    assert data["ledger"]["weights_digest"]["baseline"] != data["ledger"]["weights_digest"]["run"]
    first = traj["items"][0]
    # the diff names the item, the precision and the first differing token, as syrupy shows a snapshot's
    assert (f"{first['item']}@bf16 from token {first['position']}: baseline id {first['was']}, this run id "
            f"{first['now']}") in out
    assert "    - '" in out and "    + '" in out and first["was_text"]  # each side as text, its ids beside it
    assert f"REGRESSION bf16 trajectories: {traj['changed']}/8 changed token for token" in out


def edit_ledger(src: Path, dest: Path, divergent: bool) -> Path:
    """A copy of the recorded baseline with one more divergent unit (``divergent``) or one fewer."""
    shutil.copytree(src, dest)
    path = dest / LEDGER
    doc = json.loads(path.read_text())
    units = [u for u in doc["units"].values() if u.get("constructions")]
    c = next(u["constructions"] for u in units if (u["constructions"]["live"]["suffix"] !=
                                                   u["constructions"]["prefill"]["suffix"]) != divergent)
    c["prefill"]["suffix"] = c["live"]["suffix"] + " 0" if divergent else c["live"]["suffix"]
    path.write_text(json.dumps(doc))
    return dest


@pytest.mark.slow  # runs the audit on perturbed checkpoints
def test_less_divergence_is_an_improvement_more_is_a_failed_test(recorded: Path, tmp_path: Path) -> None:
    base = recorded / "snapshots" / "step-1000"
    shutil.copytree(recorded / "snapshots", tmp_path / "snapshots")  # ledger_audit passes: the ledger is there
    more = edit_ledger(base, tmp_path / "baseline-more", divergent=True)
    rep = tmp_path / "r.json"
    ok = run(tmp_path, f"--kvaudit-model={recorded / 'step-1000'}", N, BF16, f"--kvaudit-baseline={more}",
             f"--kvaudit-report={rep}")
    assert ok.returncode == 0, ok.stdout[-4000:]
    assert "improvement bf16 divergent suffixes (live vs prefill): " in ok.stdout
    assert "bf16 trajectories: 0/8 changed token for token" in ok.stdout
    # the edited prefill continuation is a continuation that moved: reported, not failed by default
    assert "bf16 continuations: 1 changed token for token where the trajectory held" in ok.stdout
    changes = ok.stdout.split("changes from the baseline")[1].split("short test summary")[0]
    assert "ledger_audit" not in changes  # its ledger's presence only
    cmp = json.loads(rep.read_text())["baseline"]
    assert cmp["regressions"] == 0 and cmp["improvements"] == 1
    assert cmp["claims"]["ledger_audit"] == {"was": {"status": "inconclusive", "n": 0, "k": 0},
                                             "now": cmp["claims"]["ledger_audit"]["now"], "kind": "not_compared"}
    assert cmp["claims"]["ledger_audit"]["now"]["status"] == "inconclusive"  # 8 units reproduced, fewer than 12
    fewer = edit_ledger(base, tmp_path / "baseline-fewer", divergent=False)
    bad = run(tmp_path, f"--kvaudit-model={recorded / 'step-1000'}", N, BF16, f"--kvaudit-baseline={fewer}",
              f"--kvaudit-html={tmp_path / 'r.html'}")
    assert bad.returncode == 1, bad.stdout[-4000:]
    assert "FAILED kvaudit::baseline" in bad.stdout
    assert "REGRESSION bf16 divergent suffixes (live vs prefill): " in bad.stdout
    html = (tmp_path / "r.html").read_text()
    assert "Against the baseline" in html and "<span class='fail'>regression</span>" in html
    assert html.index("id='gate'") < html.index("id='claims'")
    assert "Gate against the baseline" in html and "FAILED</span>: " in html


def test_a_truncated_ledger_is_refused_at_configure_within_seconds(recorded: Path, pytester: pytest.Pytester) -> None:
    base = pytester.path / "baseline"
    shutil.copytree(recorded / "snapshots" / "step-1000", base)
    ledger = base / LEDGER
    ledger.write_text(ledger.read_text()[: len(ledger.read_text()) // 2])  # its report.json intact
    t = time.perf_counter()
    res = pytester.runpytest_subprocess(f"--kvaudit-model={recorded / 'step-1000'}", "--kvaudit-claims=all", BF16, N,
                                        f"--kvaudit-baseline={base}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR and time.perf_counter() - t < 60
    res.stderr.fnmatch_lines([f"ERROR: --kvaudit-baseline={base} cannot gate this run: *test_ledger_audit.json*"])
    assert res.stderr.str().count("cannot gate this run") == 1  # said once


@pytest.mark.slow  # the plan calibrates on the model
def test_the_plan_checks_the_baseline_and_stated_defaults_gate_as_unset_ones(recorded: Path,
                                                                              pytester: pytest.Pytester) -> None:
    base = recorded / "snapshots" / "step-1000"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={recorded / 'step-1000'}", BF16, "--kvaudit-n=12",
                                        "--kvaudit-plan", f"--kvaudit-baseline={base}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["  n (items): baseline 8, this run 12 (--kvaudit-n)"])
    # the README's advice, pinning the threads and the attention, against a baseline that left them unset
    res = pytester.runpytest_subprocess(f"--kvaudit-model={recorded / 'step-1000'}", BF16, N, "--kvaudit-plan",
                                        "--kvaudit-threads=1", "--kvaudit-attn=sdpa", f"--kvaudit-baseline={base}")
    # checked as above, and accepted: nothing here to plan (no claim collected), no refusal
    assert res.ret == pytest.ExitCode.NO_TESTS_COLLECTED, res.stdout.str()[-3000:] + res.stderr.str()[-2000:]
    assert "cannot gate" not in res.stderr.str()


@pytest.mark.parametrize(("args", "says"), [
    (["--kvaudit-baseline={root}/nowhere"],
     "ERROR: --kvaudit-baseline: no report at *nowhere: record one with --snapshot-update*"),
    (["--kvaudit-baseline={base}", "--kvaudit-n=9"], "  n (items): baseline 8, this run 9 (--kvaudit-n)"),
    (["--kvaudit-baseline={base}", "--kvaudit-items=builtin:arith-v2", N],
     "  items: baseline *step-1000/items.jsonl (sha256:*), this run builtin:arith-v2 (*): another item set*"),
    (["--kvaudit-baseline={base}", "--kvaudit-dtypes=bf16,fp32", N],
     "  settings.dtypes: baseline bf16, this run bf16,fp32"),
], ids=["missing", "another-n", "another-item-set", "another-precision"])
def test_a_baseline_that_cannot_gate_is_refused_before_anything_loads(recorded: Path, pytester: pytest.Pytester,
                                                                       args: list[str], says: str) -> None:
    pytester.makeconftest("""
        import sys
        def pytest_unconfigure(config):
            open("torch-imported", "w").write(str("torch" in sys.modules))
    """)
    base = recorded / "snapshots" / "step-1000"
    t = time.perf_counter()
    res = pytester.runpytest_subprocess(f"--kvaudit-model={recorded / 'step-1000'}", "--kvaudit-claims=all", BF16,
                                        *[a.format(root=recorded, base=base) for a in args])
    took = time.perf_counter() - t
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([says])
    assert (pytester.path / "torch-imported").read_text() == "False"  # no model loaded, nothing computed
    assert took < 60, took


def test_baseline_fail_without_a_baseline_is_a_usage_error_in_one_line(pytester: pytest.Pytester) -> None:
    """The rules of a comparison with nothing to compare would be silently ignored: the flag alone is refused
    before anything loads, and the baseline read from the ini (no --kvaudit-baseline flag) lets it through."""
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-baseline-fail=bogus:up")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert [ln for ln in res.stderr.lines if ln.strip()] == [
        "ERROR: --kvaudit-baseline-fail says what fails the baseline gate, and no baseline is given: add "
        "--kvaudit-baseline=DIR (a recorded run's snapshots folder) or leave it out"]
    pytester.makeini(f"[pytest]\nkvaudit_baseline = {pytester.path / 'nowhere'}\n")
    res = pytester.runpytest_subprocess("--kvaudit-model=embedded", "--kvaudit-baseline-fail=bogus:up")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: --kvaudit-baseline-fail: 'bogus:up' is not a rule*"])


def test_the_ini_rules_wait_for_a_baseline_and_strict_alone_is_valid(pytester: pytest.Pytester) -> None:
    """A project's ini may name the gate's rules once for its record and gate runs alike: a record run (no
    baseline) does not read them, a gate run does; --kvaudit-strict needs no baseline."""
    pytester.makeini("[pytest]\nkvaudit_baseline_fail = bogus:up\n")
    pytester.makepyfile(test_mine="""
        def test_mine(kvaudit_records, kvaudit_judge):
            kvaudit_judge.exact("mine", {f"{r.item_id}@{r.dtype}": r.eligible for r in kvaudit_records}, min_units=2)
    """)
    args = ["--kvaudit-model=embedded", "--kvaudit-n=2", "--kvaudit-dtypes=fp32", "-p", "no:cacheprovider"]
    res = pytester.runpytest_subprocess(*args, "--kvaudit-strict")
    res.assert_outcomes(passed=1)
    res = pytester.runpytest_subprocess(*args, f"--kvaudit-baseline={pytester.path / 'nowhere'}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: kvaudit_baseline_fail (ini): 'bogus:up' is not a rule*"])
