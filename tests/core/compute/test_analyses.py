"""Beyond the paper: anatomy, layer sweep, axes, and the HTML report, asserted on content."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kvtest import BREAK, LOW_BARS, REPO, flat
from pytest_kvaudit.claims.analyses import first_divergence


def test_first_divergence() -> None:
    assert first_divergence((1, 2, 3), (1, 2, 3)) is None
    assert first_divergence((1, 2, 3), (1, 5, 3)) == 1
    assert first_divergence((1, 2), (1, 2, 3)) == 2


def test_sweep_anatomy_axes_and_html(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    for f in (REPO / "suites").glob("test_*.py"):
        if f.name != "test_ledger_audit.py":
            shutil.copy(f, pytester.path / f.name)
    pytester.makeini(LOW_BARS)
    # noise in the deepest layer of the prefill state only: the divergence lives in layer 1
    pytester.makeconftest(BREAK + (
        "def last_layer(cache, path):\n"
        "    if path == 'prefill':\n"
        "        k, v = kv.layer_kv(cache)[-1]\n"
        "        k.add_(8 * torch.randn(k.shape, generator=torch.Generator().manual_seed(0)).to(k.dtype))\n"
        "def pytest_kvaudit_faults(config):\n    return Faults(state=last_layer)\n\n"
    ))
    rep, page = pytester.path / "r.json", pytester.path / "r.html"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=8", "--kvaudit-chunks=3",
                                        "--kvaudit-attn=sdpa,eager",
                                        "--kvaudit-analyses=batch_invariance",  # no claim reads it: asked for
                                        f"--kvaudit-report={rep}", f"--kvaudit-html={page}", "-p", "no:cacheprovider")
    data = json.loads(rep.read_text())
    a = data["analyses"]
    div = a["anatomy"]["divergent"]
    assert div and all(r["first_divergence"] >= 0 and r["margin_live"] is not None for r in div)
    drift = a["anatomy"]["drift"]["fp32"]
    assert drift[0]["keys_max_abs"] < 1e-5 and drift[-1]["keys_max_abs"] > 1.0  # only the last layer moved
    sweep = a["layer_sweep"]
    assert sweep["minimal_sufficient"]["layers"] == [1]  # the noisy layer alone carries it
    rows = {r["subset"]: r for r in sweep["subsets"]}
    assert rows["1:kv"]["follow_rate"] == 1.0 and rows["0:kv"]["follow_rate"] < 1.0
    assert "layer_sweep" not in data["claims"]  # an analysis; donor_following quotes what it found
    df = data["claims"]["donor_following"]["figures"]
    assert "1:kv" in df["sufficient_subsets"] and df["minimal_sufficient"] == "1:kv"
    assert set(df["differing_layers"]["bf16"]) == {"1"}  # the untouched layer is bit-identical in bf16
    constructions = {(r["dtype"], r["construction"]) for r in a["axes"]}
    assert ("bf16", "chunked(3)") in constructions and ("fp32", "incremental") in constructions
    inc = next(r for r in a["axes"] if r["construction"] == "incremental")
    assert inc["state_equals_live"] == inc["n"] == 8
    eager = [r for r in a["axes"] if r["attn"] == "eager"]
    assert {r["dtype"] for r in eager} == {"bf16", "fp32"} and all(r["n"] == 8 for r in eager)
    bi = {r["dtype"]: r for r in a["batch_invariance"]}
    assert set(bi) == {"bf16", "fp32"} and bi["fp32"]["n"] == 8 and bi["fp32"]["batch_size"] == 4
    html = page.read_text()
    for name in data["claims"]:
        assert f"<code>{name}</code>" in html
    for r in div:
        assert f"<td>{r['item']}</td><td>{r['dtype']}</td><td>{r['first_divergence']}</td>" in html
    assert len(re.findall(r"<img alt='[^']+' src='data:image/png;base64,", html)) == 4
    for section in ("matched", "2x2", "transplant", "anatomy", "sweep", "axes", "batch"):
        assert f"class=\"{section}\"" in html
    res.stdout.fnmatch_lines(["*donor_following*PASS*"])  # its figures on the row's detail lines
    assert "differing layers bf16 1; fp32 0,1" in flat(res.stdout.str()), res.stdout.str()
    # every counterexample, with its texts, in the HTML; the first three in the terminal
    details = [d for c in data["claims"].values() for d in c.get("details", [])]
    assert details and "id='counterexamples'" in html
    assert html.count("<tr>") >= len(details)
