"""The suite runs unmodified on tiny random checkpoints of many architectures; where the cache holds more
than K/V (hybrid, recurrent), the whole state is audited: the bridge covers the conv and recurrent states too
(the zoo, tests/core/runtime/test_zoo.py, covers 30 families)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtest import LOW_BARS, REPO
from pytest_kvaudit.testing import ARCHITECTURES, tiny_checkpoint

PLAIN = ["llama", "mistral", "gemma2", "phi3", "gpt2", "qwen3", "qwen2_moe"]
STATEFUL = ["lfm2", "mamba"]


@pytest.fixture(scope="module")
def arch_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    """Built before the test's pytester starts: pytester drops the modules a test imported when it ends, and
    torch's modules imported twice in one process break (torch.library refuses a second registration)."""
    arch = request.param
    return arch, tiny_checkpoint(tmp_path_factory.mktemp(arch), arch, n_items=4, max_new_tokens=12)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("arch_checkpoint", PLAIN + STATEFUL, indirect=True)
def test_suite_on_architecture(pytester: pytest.Pytester, arch_checkpoint: tuple[str, Path]) -> None:
    arch, ck = arch_checkpoint
    assert arch in ARCHITECTURES
    for f in (REPO / "suites").glob("test_*.py"):
        if f.name != "test_ledger_audit.py":
            shutil.copy(f, pytester.path / f.name)
    pytester.makeini(LOW_BARS)
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ck}", "--kvaudit-n=4", f"--kvaudit-report={rep}",
                                        "-p", "no:cacheprovider", "-W", "ignore")
    data = json.loads(rep.read_text())
    s = {k: v["status"] for k, v in data["claims"].items()}
    assert "Traceback" not in res.stdout.str()
    assert data["model"]["architecture"].lower().startswith(arch.split("_")[0][:4])
    if data["items"]["eligible"] == 0:  # a random model that ends before the boundary: honest, not a pass
        assert set(s.values()) == {"inconclusive"}
        return
    assert s["replica_exactness"] == "pass"
    # every kind of state is audited whole: the bridge over K/V, conv and recurrent states alike
    bridge = data["claims"]["bridge_bitexact"]
    assert s["bridge_bitexact"] == "pass" or (s["bridge_bitexact"] == "inconclusive" and "needs" in bridge["reason"])
    assert not any("beyond K/V" in c["reason"] for c in data["claims"].values())
    if arch in STATEFUL:
        assert any("recurrent" in k for k in data["model"]["layer_kinds"]), data["model"]["layer_kinds"]
