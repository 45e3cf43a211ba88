"""The plugin as a user runs it (pytester, in subprocesses since torch is imported), and proof that
every claim can fail: a deliberately broken model or construction makes each one fail or go inconclusive."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtest import BREAK, LOW_BARS, REPO, faults, flat, run, setup_suite, statuses

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

def test_help_lists_the_kvaudit_group(pytester: pytest.Pytester) -> None:
    res = pytester.runpytest_subprocess("--help")
    res.stdout.fnmatch_lines(["*kvaudit*", "*--kvaudit-model=KVAUDIT_MODEL*", "*--kvaudit-dtypes=*",
                              "*--kvaudit-report=*", "*kvaudit_thresholds*"])


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, pytest_kvaudit.plugin; assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bad_option_values_are_one_line_usage_errors(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    res = pytester.runpytest_subprocess("--kvaudit-dtypes=bf16,fp8")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["ERROR: --kvaudit-dtypes: unknown precision 'fp8'; use bf16, fp16, fp32, q8_0"])


def test_missing_checkpoint_is_one_line_per_claim(pytester: pytest.Pytester, tmp_path: Path) -> None:
    setup_suite(pytester)
    res, _ = run(pytester, tmp_path / "nowhere")
    res.assert_outcomes(errors=7)  # one a claim file setup_suite lays out, prefix_cache included
    res.stdout.fnmatch_lines(["*checkpoint directory */nowhere does not exist: pass --kvaudit-model=DIR*"])
    res.stdout.no_fnmatch_line("*Traceback*")


def test_suite_runs_on_a_tiny_llama_and_writes_the_report(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, data = run(pytester, tiny_llama, "--junitxml=junit.xml")
    assert res.ret == 0, res.stdout.str()
    assert set(data) >= {"model", "environment", "items", "claims", "analyses", "cost"}
    assert data["model"]["architecture"] == "LlamaForCausalLM" and data["model"]["num_layers"] == 2
    assert data["model"]["weights_digest"].startswith("sha256:")
    assert data["items"] == {"total": 8, "eligible": 8, "ineligible": {}, "ineligible_items": [],
                             "set": str(tiny_llama / "items.jsonl"), "stop_regex": None}
    for name in ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "donor_following"):
        c = data["claims"][name]
        assert set(c) >= {"status", "n", "k", "interval", "reason", "figures"}
    s = statuses(data)
    assert s["replica_exactness"] == "pass" and s["bridge_bitexact"] == "pass"
    assert data["claims"]["replica_exactness"]["n"] == 8 * 2 * 2
    m = data["claims"]["matched_construction"]["figures"]
    assert set(m["divergent_suffixes"]) == {"bf16", "fp32"}
    for key in ("label_disagreements", "accuracy_live", "accuracy_prefill", "accuracy_diff", "accuracy_diff_ci"):
        assert set(m[key]) == {"bf16", "fp32"}
    # an answer changes only where the suffix does, and a changed label needs a changed answer
    assert all(m["label_disagreements"][d] <= m["answer_changes"][d] <= m["divergent_suffixes"][d] for d in m["n"])
    assert set(data["claims"]["fixed_prefix_2x2"]["figures"]["disagreements"]) == {"bf16", "fp32"}
    # the least the selected claims need is priced apart from what ran: they decide what runs (no batch probe,
    # no ledger_audit here), so only the layer sweep donor_following quotes, on divergent units, is beyond it
    assert data["cost"]["forward_tokens"] >= data["cost"]["minimal_forward_tokens"] > 0
    res.stdout.fnmatch_lines(["*kvaudit claims*", "claim*verdict*n*k*interval*statistic",
                              "replica_exactness*PASS*32*32*Wilson 95% CI of k/n*", "bridge_bitexact*PASS*"])
    assert "Infinity" not in (pytester.path / "report.json").read_text()  # JSON numbers stay finite or null
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="kvaudit_claim"' in junit


def test_noise_in_one_replica_fails_replica_exactness(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester, BREAK + faults(logits="noisy_logits({'prefill:replica'})"))
    res, data = run(pytester, tiny_llama, "test_replica_exactness.py")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*replica_exactness FAILED: 16 replica(s) differ, the first t00@bf16/prefill in its "
                              "logits fingerprint (suffix and boundary state identical): t00@bf16/prefill (logits)*"])
    assert statuses(data) == {"replica_exactness": "fail"}
    assert data["claims"]["replica_exactness"]["k"] == 16


def test_perturbed_incremental_path_fails_the_bridge(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester, BREAK + faults(state="noisy_state({'incremental'})"))
    res, data = run(pytester, tiny_llama, "test_bridge_bitexact.py")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*bridge_bitexact FAILED: incremental differs from live on t00@bf16 (K/V of layers "
                              "0:k,0:v,1:k,1:v)*"])


def test_transplants_follow_when_the_cache_carries_the_divergence(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester, BREAK + faults(state="noisy_state({'prefill'})"))
    res, data = run(pytester, tiny_llama, "test_donor_following.py")
    fig = data["claims"]["donor_following"]["figures"]
    assert fig["live_to_prefill"][1] >= 3, fig  # the noise made divergent units
    assert fig["live_to_prefill"][0] == fig["live_to_prefill"][1]
    assert fig["prefill_to_live"][0] == fig["prefill_to_live"][1]
    res.assert_outcomes(passed=1)


def test_a_transplant_that_copies_nothing_fails_donor_following(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    conftest = BREAK + faults(state="noisy_state({'prefill'})",
                              transplant="lambda receiver, donor, layers, parts: kv.clone(receiver)")
    setup_suite(pytester, conftest)
    res, data = run(pytester, tiny_llama, "test_donor_following.py")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*donor_following FAILED: receivers that did not follow: t0*"])
    assert data["claims"]["donor_following"]["k"] == 0


SHAM_NOISE = """
def sham_noise(receiver, donor, layers, parts):
    out = kv.transplant(receiver, donor, layers, parts)
    if receiver is donor:  # only the sham control: the receiver's own cache through the transplant path
        gen = torch.Generator().manual_seed(1)
        for k, v in kv.layer_kv(out):
            k.add_(8 * torch.randn(k.shape, generator=gen).to(k.dtype))
    return out
"""


def test_a_sham_transplant_that_corrupts_fails_donor_following_on_its_control(pytester: pytest.Pytester,
                                                                           tiny_llama: Path) -> None:
    setup_suite(pytester, BREAK + SHAM_NOISE + faults(state="noisy_state({'prefill'})", transplant="sham_noise"))
    res, data = run(pytester, tiny_llama, "test_donor_following.py")
    res.assert_outcomes(failed=1)
    c = data["claims"]["donor_following"]
    f = c["figures"]
    # the donors are still followed: only the control shows that the transplant path changes outcomes itself
    assert f["live_to_prefill"][0] == f["live_to_prefill"][1] >= 3
    assert f["sham_flips"][0] >= 1 and f["sham_flips"][1] == 2 * f["live_to_prefill"][1]
    assert f["identical_layer_flips"][0] == 0
    res.stdout.fnmatch_lines(["*donor_following FAILED: receivers that did not follow: t0*@bf16 sham "
                              "prefill_to_prefill*"])
    sham = [d for d in c["details"] if d["a"].startswith("sham")]
    assert sham and all(d["position"] is not None and d["text_a"] != d["text_b"] for d in sham)


def test_controls_flip_nothing_and_name_the_differing_layers(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    # noise in the last layer of the prefill state: layer 0 stays bit-identical, so it is the identical-layer control
    conftest = BREAK + (
        "def last_layer(cache, path):\n"
        "    if path == 'prefill':\n"
        "        k, v = kv.layer_kv(cache)[-1]\n"
        "        k.add_(8 * torch.randn(k.shape, generator=torch.Generator().manual_seed(0)).to(k.dtype))\n"
        "def pytest_kvaudit_faults(config):\n    return Faults(state=last_layer)\n"
    )
    setup_suite(pytester, conftest)
    # in bf16 the tiny model's untouched layers are bit-identical in the two states (in fp32 they drift by ~1e-6)
    res, data = run(pytester, tiny_llama, "test_donor_following.py", "--kvaudit-dtypes=bf16")
    res.assert_outcomes(passed=1)
    f = data["claims"]["donor_following"]["figures"]
    units = f["live_to_prefill"][1]
    assert units >= 1 and f["sham_flips"] == [0, 2 * units] and f["identical_layer_flips"] == [0, 2 * units]
    assert f["differing_layers"] == {"bf16": {"1": units}}
    assert "1:kv" in f["sufficient_subsets"] and f["minimal_sufficient"] == "1:kv"
    res.stdout.fnmatch_lines(["donor_following*PASS*"])  # its figures on the row's detail lines
    assert re.search(r"sham flips 0/\d+, identical-layer flips 0/\d+; differing layers bf16 1",
                     flat(res.stdout.str())), res.stdout.str()


def test_an_answer_regex_that_never_matches_is_inconclusive(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester, ini=LOW_BARS)
    res, data = run(pytester, tiny_llama, "--kvaudit-answer-regex=(nomatch)", "test_matched_construction.py")
    res.assert_outcomes(skipped=1)
    c = data["claims"]["matched_construction"]
    assert c["status"] == "inconclusive"
    assert c["figures"]["labels_extracted"] == {"bf16": [0, 8], "fp32": [0, 8]}
    res.stdout.fnmatch_lines(["*matched_construction inconclusive: bf16: an answer extracted on both sides for 0/8 "
                              "eligible items (0%), needs 80% (7): check the answer regex*"])


def test_the_2x2_computes_its_own_cells(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    # noise on the 2x2's own prefill cell at bf16 only: the matched run is untouched, so if the 2x2 read the
    # matched cells back (recurrence by construction) this could not show; observed, the sets now differ
    setup_suite(pytester, BREAK + faults(state="noisy_state({'fixed:prefill'}, {'torch.bfloat16'})"))
    res, data = run(pytester, tiny_llama, "test_fixed_prefix_2x2.py")
    res.assert_outcomes(failed=1)
    f = data["claims"]["fixed_prefix_2x2"]["figures"]
    assert f["fixed_only"]["bf16"] >= 1 and f["disagreements"]["fp32"] == 0
    res.stdout.fnmatch_lines(["*fixed_prefix_2x2 FAILED: bf16: the 2x2's divergent set differs from the matched one on "
                              "*"])
    d = data["claims"]["fixed_prefix_2x2"]["details"][0]
    assert d["a"] == "fixed:replay" and d["side"] == "2x2 only" and d["text_a"] != d["text_b"]


def test_the_2x2_with_its_prefix_from_fp32(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, data = run(pytester, tiny_llama, "--kvaudit-dtypes=fp32,bf16", "test_fixed_prefix_2x2.py")
    f = data["claims"]["fixed_prefix_2x2"]["figures"]
    assert f["prefix_from"] == "fp32" and f["n"] == {"fp32": 8, "bf16": 8}
    # bf16's recurrence is judged only where its own trajectory reached fp32's prefix ids
    assert f["recurrence_units"]["bf16"] + f["recurrence_excluded"]["bf16"] == 8
    assert "recurrence_primary" not in f


def test_fp32_noise_that_flips_tokens_fails_the_2x2(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    ini = LOW_BARS.replace("fixed_prefix_2x2.max_rate=0.5", "fixed_prefix_2x2.max_rate=0.02")
    setup_suite(pytester, BREAK + faults(state="noisy_state({'prefill', 'fixed:prefill'}, {'torch.float32'})"), ini)
    res, data = run(pytester, tiny_llama, "test_fixed_prefix_2x2.py")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*fixed_prefix_2x2 FAILED: *fp32: * decoded disagreements*"])
    assert data["claims"]["fixed_prefix_2x2"]["figures"]["disagreements"]["fp32"] >= 1


def test_zero_eligible_items_make_every_claim_inconclusive(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, data = run(pytester, tiny_llama, "--kvaudit-boundary=|||||")
    # five inconclusive; lossy_cache_budget (no lossy kind) and prefix_cache (no prefix cache) not applicable
    res.assert_outcomes(skipped=7)
    assert set(statuses(data).values()) == {"inconclusive"}
    assert data["items"]["eligible"] == 0 and data["items"]["ineligible"] == {"boundary_not_reached": 8}
    res.stdout.fnmatch_lines(["*replica_exactness inconclusive: 0 replica units, needs 4 (ineligible: "
                              "boundary_not_reached 16)*"])


@pytest.fixture(scope="module")
def baseline_claims(tmp_path_factory: pytest.TempPathFactory, tiny_llama: Path) -> dict:
    from pytest_kvaudit.report.document import dumps  # noqa: F401  (the same serialiser the report uses)

    d = tmp_path_factory.mktemp("baseline")
    for f in (REPO / "suites").glob("test_*.py"):
        if f.name != "test_ledger_audit.py":
            shutil.copy(f, d / f.name)
    (d / "pytest.ini").write_text(LOW_BARS)
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--kvaudit-model={tiny_llama}",
                    "--kvaudit-n=8", f"--kvaudit-report={d / 'r.json'}", "--kvaudit-claims=none"], cwd=d, check=True,
                   capture_output=True)
    return json.loads((d / "r.json").read_text())


@pytest.mark.parametrize("mode", [["-n", "0"], ["-n", "2"], ["-p", "no:xdist"]], ids=["n0", "n2", "no-xdist"])
def test_figures_are_identical_with_and_without_xdist(pytester: pytest.Pytester, tiny_llama: Path,
                                                      baseline_claims: dict, mode: list[str]) -> None:
    setup_suite(pytester)
    res, data = run(pytester, tiny_llama, *mode)
    assert res.ret == 0, res.stdout.str()
    assert data["claims"] == baseline_claims["claims"]
    assert data["items"] == baseline_claims["items"]
    assert data["cost"]["forward_tokens"] == baseline_claims["cost"]["forward_tokens"]


def test_xdist_spends_the_transplant_budget_as_one_process(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    """With one donor unit, which unit gets the transplants is decided by the units before it, which another
    worker may still be computing: the workers wait for them, so both runs compute the same thing."""
    setup_suite(pytester, BREAK + faults(state="noisy_state({'prefill'})"))  # several divergent units
    reports = []
    for mode in (["-n", "0"], ["-n", "2"]):
        res, data = run(pytester, tiny_llama, "test_donor_following.py", "--kvaudit-donor-units=1", *mode)
        assert res.ret == 0, res.stdout.str()
        reports.append(data)
    one, two = reports
    assert one["claims"]["donor_following"]["n"] == 2  # one unit, both directions
    assert one["claims"] == two["claims"] and one["analyses"] == two["analyses"]
    assert one["cost"]["forward_tokens"] == two["cost"]["forward_tokens"]


def test_a_crashed_worker_never_turns_into_a_pass(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    # worker gw1 dies on the second item it takes: the cells it computed die with it (work stealing hands
    # out the rest to gw0, which gives up on the lost items' later precisions once gw1 is known dead)
    crash = (
        "import os\n"
        "from pytest_kvaudit.core.compute.cells import CellBuilder\n"
        "_inner, taken = CellBuilder.compute, []\n"
        "def cell(self, item, *a):\n"
        "    taken.append(item.id)\n"
        "    if os.environ.get('PYTEST_XDIST_WORKER') == 'gw1' and len(taken) == 2:\n"
        "        os._exit(3)\n"
        "    return _inner(self, item, *a)\n"
        "CellBuilder.compute = cell\n"
    )
    setup_suite(pytester, crash)
    res, data = run(pytester, tiny_llama, "-n", "2")
    assert res.ret != 0
    assert "pass" not in statuses(data).values()
    assert data["items"]["ineligible"].get("missing", 0) >= 1
    res.stdout.fnmatch_lines(["*items missing (a worker died*"])


def test_a_marker_the_tokenizer_cannot_spell_is_one_line(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, _ = run(pytester, tiny_llama, "--kvaudit-boundary=</think>", "test_replica_exactness.py")
    res.assert_outcomes(errors=1)
    res.stdout.fnmatch_lines(["*boundary marker '</think>' cannot be produced by the tokenizer of *: pass "
                              "--kvaudit-boundary*"])


def test_out_of_memory_on_one_item_is_reported_and_the_run_goes_on(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    oom = (
        "from pytest_kvaudit.core.compute.cells import CellBuilder\n"
        "_inner = CellBuilder.compute\n"
        "def cell(self, item, *a):\n"
        "    if item.id == 't02':\n"
        "        raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
        "    return _inner(self, item, *a)\n"
        "CellBuilder.compute = cell\n"
    )
    setup_suite(pytester, oom)
    res, data = run(pytester, tiny_llama, "test_replica_exactness.py", "test_bridge_bitexact.py")
    res.assert_outcomes(passed=2)
    assert data["items"]["ineligible"] == {"error": 1} and data["items"]["eligible"] == 7
    assert data["claims"]["replica_exactness"]["n"] == 7 * 2 * 2


def test_report_header_names_model_precisions_device_and_seed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    res = pytester.runpytest_subprocess("--kvaudit-dtypes=fp32", "--kvaudit-seed=7")
    res.stdout.fnmatch_lines(["kvaudit: model=*embedded dtypes=fp32 device=auto attn=checkpoint default seed=7"])


def test_tf32_switch_is_applied_and_recorded(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester)
    res, data = run(pytester, tiny_llama, "--kvaudit-tf32=on", "--kvaudit-n=4", "test_replica_exactness.py")
    assert data["environment"]["tf32_matmul"] is True and data["environment"]["tf32_cudnn"] is True
    res = pytester.runpytest_subprocess("--kvaudit-tf32=maybe")
    res.stderr.fnmatch_lines(["ERROR: --kvaudit-tf32='maybe': use on or off"])
