"""The embedded checkpoint: loads through the ordinary path, shows the phenomenon, and its committed
ledger audits (on the first items, so CI stays short; `pytest suites` audits all 200)."""

from __future__ import annotations

import json
import shutil

import pytest

from kvtest import REPO, flat
from pytest_kvaudit.core.model.config import EMBEDDED_DIR


def test_embedded_checkpoint_is_small_and_safetensors() -> None:
    files = {p.name: p.stat().st_size for p in EMBEDDED_DIR.iterdir()}
    assert "model.safetensors" in files and not any(n.endswith(".bin") for n in files)
    assert sum(files.values()) < 20 * 2**20
    assert len((EMBEDDED_DIR / "items.jsonl").read_text().splitlines()) == 200
    recipe = json.loads((EMBEDDED_DIR / "recipe.json").read_text())
    assert recipe["seed"] == 0 and recipe["threads"] == 1


def test_tokenizer_loads_offline_and_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(str(EMBEDDED_DIR))
    ids = tok("S37194:3+7=10;")["input_ids"]
    assert len(ids) == len("S37194:3+7=10;") and tok.decode(ids) == "S37194:3+7=10;"


def test_committed_ledger_audits_on_the_first_items(pytester: pytest.Pytester) -> None:
    shutil.copy(REPO / "suites" / "test_ledger_audit.py", pytester.path)
    res = pytester.runpytest_subprocess("--kvaudit-n=12", f"--kvaudit-snapshots={REPO / 'snapshots'}",
                                        "-p", "no:cacheprovider", "-p", "no:randomly")
    if res.parseoutcomes().get("passed") == 1:  # the environment that recorded the ledger: every bit back
        res.stdout.fnmatch_lines(["*ledger_audit*PASS*24*24*"])  # its figures on the row's detail lines
        assert "all 24 recorded units reproduced (ids, labels and every fingerprint)" in flat(res.stdout.str())
    else:  # another CPU instruction set or library: the bits are not comparable, and the run says which fields
        res.assert_outcomes(skipped=1)
        res.stdout.fnmatch_lines(["*ledger_audit*INCONCLUSIVE*"])
        assert "recorded in another environment (environment." in flat(res.stdout.str()), res.stdout.str()


@pytest.mark.parametrize("where", ["empty-directory", "checkout"])
def test_the_shipped_ledger_leaves_a_run_with_other_settings_unjudged(pytester: pytest.Pytester, where: str) -> None:
    """A first run with another item set (docs/guides/item-sets.md) finds only the ledger kvaudit ships, recorded
    for the default items: from an empty directory (read from the package) or in the checkout (the same file,
    committed under snapshots/), nothing of this run's own to audit, so no verdict (not a FAIL of the checkpoint);
    a ledger of the user's own with other settings is still refused (test_exact_items.py)."""
    shutil.copy(REPO / "suites" / "test_ledger_audit.py", pytester.path)
    rep = pytester.path / "r.json"
    snaps = [f"--kvaudit-snapshots={REPO / 'snapshots'}"] if where == "checkout" else []
    res = pytester.runpytest_subprocess(f"--kvaudit-items={REPO / 'fixtures' / 'embedded' / 'items-labels.jsonl'}",
                                        "--kvaudit-n=2", "--kvaudit-dtypes=fp32", f"--kvaudit-report={rep}",
                                        *snaps, "-p", "no:cacheprovider")
    res.assert_outcomes(skipped=1)
    c = json.loads(rep.read_text())["claims"]["ledger_audit"]
    assert c["status"] == "inconclusive" and c["reason"].startswith("the ledger kvaudit ships (") and \
        "recorded for the default settings, not this run's: config." in c["reason"], c["reason"]


def test_first_items_show_divergence_in_bf16_only(pytester: pytest.Pytester) -> None:
    for name in ("test_matched_construction.py", "test_donor_following.py"):
        shutil.copy(REPO / "suites" / name, pytester.path)
    # low bars for 12 items: the embedded model is right on every item, so its labels cannot move (min_each), and
    # Tango's interval at 12 pairs is ±24 points (margin)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    matched_construction.min_units=12\n"
                     "    matched_construction.min_each=0\n    matched_construction.margin=1.0\n"
                     "    donor_following.min_units=1\n")
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess("--kvaudit-n=12", f"--kvaudit-report={rep}", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    m = json.loads(rep.read_text())["claims"]["matched_construction"]["figures"]
    assert m["divergent_suffixes"]["bf16"] >= 1 and m["divergent_suffixes"]["fp32"] == 0
    assert m["accuracy_live"]["bf16"] >= 0.9
