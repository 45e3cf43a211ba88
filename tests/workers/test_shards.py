"""Shards over runners: three ``--kvaudit-shard`` runs and a ``--kvaudit-merge`` give a single run's report,
and shards that are not one run split N ways are refused with one line naming the files and the field."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvtest import LOW_BARS, REPO

# every test here runs pytest in subprocesses, most on shards of a model run: the full tier
pytestmark = [pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning"), pytest.mark.slow]

N_ITEMS = 12
SHARDS = 3
SKIP_REASON = "shard {i}/{n} recorded to {d}: judge with --kvaudit-merge={d}"


@dataclass
class Runs:
    """A laid-out claim suite, a single run's report, and three shards' partials (shard 0 under ``-n 2``)."""

    root: Path
    single: dict
    partials: Path
    outputs: dict[int, subprocess.CompletedProcess[str]]


def pytest_run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTEST_ADDOPTS": "--kvaudit-claims=none"}  # only the laid-out claim files
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", *args], cwd=root,
                          env=env, capture_output=True, text=True, timeout=900)


def lay_out(root: Path) -> Path:
    """The claim files as a user has them (the ledger audit needs a recorded ledger: left out), bars lowered."""
    root.mkdir(parents=True, exist_ok=True)
    for f in (REPO / "suites").glob("test_*.py"):
        if f.name != "test_ledger_audit.py":
            shutil.copy(f, root / f.name)
    (root / "pytest.ini").write_text(LOW_BARS)
    return root


def shard(root: Path, i: int, out: Path, *args: str, n: int = N_ITEMS,
          model: str = "embedded") -> subprocess.CompletedProcess[str]:
    return pytest_run(root, f"--kvaudit-model={model}", f"--kvaudit-n={n}", f"--kvaudit-shard={i}/{SHARDS}",
                      f"--kvaudit-partials={out}", *args)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    root = lay_out(tmp_path_factory.mktemp("shards") / "suite")
    single = root / "single.json"
    res = pytest_run(root, "--kvaudit-model=embedded", f"--kvaudit-n={N_ITEMS}", f"--kvaudit-report={single}")
    assert single.exists(), res.stdout + res.stderr
    partials = root.parent / "partials"
    outputs = {i: shard(root, i, partials, *(["-n", "2"] if i == 0 else [])) for i in range(SHARDS)}
    return Runs(root, json.loads(single.read_text()), partials, outputs)


def merge(runs: Runs, folder: Path) -> tuple[subprocess.CompletedProcess[str], dict]:
    report = folder.parent / f"{folder.name}-merged.json"
    res = pytest_run(runs.root, f"--kvaudit-merge={folder}", f"--kvaudit-report={report}")
    return res, json.loads(report.read_text()) if report.exists() else {}


def copy_partials(runs: Runs, name: str) -> Path:
    out = runs.partials.parent / name
    shutil.copytree(runs.partials, out)
    return out


def test_a_share_records_its_partial_and_skips_its_claims(runs: Runs) -> None:
    for i, res in runs.outputs.items():
        assert res.returncode == 0, res.stdout + res.stderr
        assert (runs.partials / f"partial-{i}-of-{SHARDS}.json").is_file()
        assert SKIP_REASON.format(i=i, n=SHARDS, d=runs.partials) in res.stdout
        partial = runs.partials / f"partial-{i}-of-{SHARDS}.json"
        assert f"kvaudit: shard {i}/{SHARDS} recorded to {partial}" in res.stdout
    doc = json.loads((runs.partials / f"partial-0-of-{SHARDS}.json").read_text())
    # under -n 2 the two workers split shard 0 further: items 0, 6 and 3, 9
    assert len(doc["exports"]) == 2
    assert sorted(r["item_id"] for e in doc["exports"] for r in e["records"] if r["dtype"] == "bf16") == \
        sorted(doc["item_set"]["items"][j][0] for j in range(0, N_ITEMS, SHARDS))
    assert doc["shard"] == [0, SHARDS] and doc["item_set"]["count"] == N_ITEMS
    assert set(doc) >= {"model", "environment", "item_set", "plan"}


def test_the_merge_judges_like_one_run(runs: Runs) -> None:
    res, merged = merge(runs, runs.partials)
    single = runs.single
    assert merged, res.stdout + res.stderr
    assert res.returncode == (0 if all(c["status"] != "fail" for c in single["claims"].values()) else 1)
    assert {c["status"] for c in single["claims"].values()} & {"pass", "fail"}, "the claims must decide"
    for key in ("claims", "items", "model", "analyses"):
        assert json.dumps(merged[key], sort_keys=True) == json.dumps(single[key], sort_keys=True), key
    env = {k: v for k, v in single["environment"].items()}
    assert merged["environment"] == env
    assert "loading" not in res.stdout  # nothing computed: the merge never reports a model load
    assert merged["cost"]["forward_tokens"] > 0  # the shards' work, added up
    # the plan block is the run's plan over the whole item set (not the options the shards compare)
    plan = merged["plan"]
    assert plan["forward_tokens"] == single["plan"]["forward_tokens"] and plan["items"] == single["plan"]["items"]
    assert plan["priced_after_run"]["forward_tokens"] == merged["cost"]["forward_tokens"]


def refusal(res: subprocess.CompletedProcess[str], *words: str) -> str:
    assert res.returncode != 0
    line = next((ln for ln in res.stdout.splitlines() if "kvaudit merge:" in ln), "")
    assert line, res.stdout
    for w in words:
        assert w in line, line
    assert "Traceback" not in res.stdout
    return line


def test_a_missing_share_is_refused(runs: Runs) -> None:
    folder = copy_partials(runs, "missing")
    (folder / f"partial-1-of-{SHARDS}.json").unlink()
    refusal(merge(runs, folder)[0], f"shard 1/{SHARDS} missing", "partial-0-of-3.json", "--kvaudit-shard=1/3")


def test_a_doubled_share_is_refused(runs: Runs) -> None:
    folder = copy_partials(runs, "doubled")
    (folder / "again").mkdir()  # as artifact downloads lay them out: a folder per runner
    shutil.copy(folder / "partial-2-of-3.json", folder / "again" / "partial-2-of-3.json")
    refusal(merge(runs, folder)[0], "shard 2/3 appears 2 times", "again/partial-2-of-3.json", "field shard")


def test_a_mix_of_share_counts_is_refused(runs: Runs) -> None:
    folder = copy_partials(runs, "mixed")
    doc = json.loads((folder / "partial-2-of-3.json").read_text())
    doc["shard"] = [0, 2]
    (folder / "partial-0-of-2.json").write_text(json.dumps(doc))
    refusal(merge(runs, folder)[0], "different shard counts", "partial-0-of-2.json (0/2)")


def test_a_share_from_another_model_is_refused(runs: Runs, tmp_path: Path) -> None:
    from pytest_kvaudit.testing import tiny_checkpoint

    folder = copy_partials(runs, "other-model")
    (folder / "partial-1-of-3.json").unlink()
    other = tiny_checkpoint(tmp_path / "tiny", "qwen2", n_items=N_ITEMS)
    res = shard(runs.root, 1, folder, model=str(other))
    assert res.returncode == 0, res.stdout + res.stderr
    refusal(merge(runs, folder)[0], "partial-1-of-3.json differs from partial-0-of-3.json in model.weights_digest",
            "one model")


def test_a_share_of_another_item_count_is_refused(runs: Runs) -> None:
    folder = copy_partials(runs, "other-count")
    (folder / "partial-2-of-3.json").unlink()
    res = shard(runs.root, 2, folder, n=N_ITEMS - 1)
    assert res.returncode == 0, res.stdout + res.stderr
    refusal(merge(runs, folder)[0], "partial-2-of-3.json differs from partial-0-of-3.json in item_set.count",
            f"({N_ITEMS - 1} vs {N_ITEMS})")


def test_shard_options_are_checked_up_front(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "suite")
    for args, msg in (
        (["--kvaudit-shard=3/3", f"--kvaudit-partials={tmp_path}"], "I must be from 0 to N-1"),
        (["--kvaudit-shard=1of3", f"--kvaudit-partials={tmp_path}"], "is not I/N"),
        (["--kvaudit-shard=0/3"], "needs --kvaudit-partials=DIR"),
        (["--kvaudit-shard=0/3", f"--kvaudit-partials={tmp_path}", f"--kvaudit-merge={tmp_path}"], "give one per run"),
    ):
        res = pytest_run(root, *args)
        assert res.returncode == pytest.ExitCode.USAGE_ERROR, res.stderr
        assert msg in res.stderr


def test_a_merge_of_an_empty_folder_says_how_to_make_partials(tmp_path: Path) -> None:
    root = lay_out(tmp_path / "suite")
    res = pytest_run(root, f"--kvaudit-merge={tmp_path / 'suite'}")
    assert res.returncode != 0
    assert "no partial-I-of-N.json under it: run each shard with --kvaudit-shard=I/N" in res.stdout


def test_a_merge_refuses_a_claim_its_shards_did_not_compute(runs: Runs) -> None:
    folder = copy_partials(runs, "narrow")
    for f in folder.glob("partial-*.json"):  # shards run with only a claim that reads live vs prefill
        doc = json.loads(f.read_text())
        doc["plan"]["work"] = ["prefill", "trajectory"]
        f.write_text(json.dumps(doc))
    res, _ = merge(runs, folder)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "claim replica_exactness needs replicas, which the run it judges did not compute" in res.stdout


def test_one_environment_from_workers_that_did_different_work() -> None:
    """A probe's own engine (vLLM's fp8) opens only on a worker with units for it: the run's environment keeps
    what any worker recorded, the first one's values first, per precision where keyed."""
    from pytest_kvaudit.workers.merge import union

    plain = {"torch": "2", "vllm_kv_cache_dtype": {"bf16": "torch.bfloat16"}}
    probed = {"torch": "2", "vllm_kv_cache_dtype": {"fp32": "torch.float32"},
              "vllm_lossy_kv_cache_dtype": {"bf16": "fp8"}}
    assert union(plain, probed) == {"torch": "2",
                                    "vllm_kv_cache_dtype": {"bf16": "torch.bfloat16", "fp32": "torch.float32"},
                                    "vllm_lossy_kv_cache_dtype": {"bf16": "fp8"}}
    assert union({}, plain) == plain and union(plain, {}) == plain
