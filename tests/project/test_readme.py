"""The docs' example claims (docs/guides/own-claim.md) work on a small checkpoint and fail on a construction that
breaks them (tests/project/test_doc_commands.py runs them as written, on the default checkpoint), and the README's
set-up commands are the ones CI runs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvtest import REPO, script

README = (REPO / "README.md").read_text()
OWN_CLAIM = (REPO / "docs" / "guides" / "own-claim.md").read_text()


def block_after(heading: str, lang: str, text: str = README) -> str:
    section = text.split(heading, 1)[1]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m, f"no ```{lang} block after {heading!r}"
    return m.group(1)


BREAK_CHUNKED = (
        "import torch\nfrom pytest_kvaudit.core.runtime import state as kv\nfrom pytest_kvaudit.core.runtime.decoder "
        "import Faults\ndef hook(c, path):\n"
        "    if path == 'chunked(4)':\n"
        "        for k, v in kv.layer_kv(c):\n"
        "            k.add_(8 * torch.randn(k.shape, generator=torch.Generator().manual_seed(1)).to(k.dtype))\n"
        "def pytest_kvaudit_faults(config):\n    return Faults(state=hook)\n\n"
)


def test_the_example_claim_fails_when_the_construction_breaks(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_chunked_claim=block_after("## A test over the store", "python", OWN_CLAIM))
    pytester.makeconftest(BREAK_CHUNKED)
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-chunks=4",
                                        "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*chunked4_equals_prefill FAILED: fails on t0*"])


def full_claim_example() -> str:
    return block_after("## A claim declared once", "python", OWN_CLAIM)


@pytest.mark.parametrize("mode", [[], ["-n", "2"]], ids=["plain", "n2"])
def test_a_claim_of_your_own_is_one_test_file(pytester: pytest.Pytester, tiny_llama: Path, mode: list[str]) -> None:
    """Row, thresholds, JSON block, key figure and HTML section from one user file, without touching the package."""
    pytester.makepyfile(test_chunked_equals_prefill=full_claim_example())
    rep, page = pytester.path / "r.json", pytester.path / "r.html"
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-chunks=4",
                                        f"--kvaudit-report={rep}", f"--kvaudit-html={page}", "-p", "no:cacheprovider",
                                        *mode)
    res.assert_outcomes(passed=1)
    # the row, then its key figure on the row's detail line (the table keeps within 120 columns)
    res.stdout.fnmatch_lines(["chunked_equals_prefill*PASS*8*8*", "*chunked(4) continues like prefill on 8/8 units"])
    data = json.loads(rep.read_text())
    assert data["claims"]["chunked_equals_prefill"]["figures"] == {"equal": [8, 8]}
    assert data["display"]["chunked_equals_prefill"]["figure"] == "chunked(4) continues like prefill on 8/8 units"
    html = page.read_text()
    assert "<h2 id='chunked_equals_prefill'>Chunked prefill (4-token chunks) vs one-shot prefill</h2>" in html


def test_a_claim_of_your_own_fails_on_its_breaking_construction(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_chunked_equals_prefill=full_claim_example())
    pytester.makeconftest(BREAK_CHUNKED)
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-chunks=4",
                                        "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*chunked_equals_prefill FAILED: chunked(4) differs on t0*"])


def test_a_claim_threshold_it_does_not_have_is_one_line(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_chunked_equals_prefill=full_claim_example().replace("min_units=4", "min_unit=4"))
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-chunks=4",
                                        "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*claim chunked_equals_prefill has no threshold 'min_unit'; it has min_units*"])
    res.stdout.no_fnmatch_line("*Traceback*")


def readme_commands() -> list:
    return script("doc_commands").page_commands(REPO / "README.md")


def test_ci_runs_the_readme_test_command() -> None:
    dc = script("doc_commands")
    tests_cmd = next(c for c in readme_commands() if c.text == "pytest -n 2")
    assert dc.built_by_ci(tests_cmd.install, ".venv") is not None, tests_cmd.install  # .ci/run's own install line
    assert dc.pip_steps(tests_cmd.install) == ["pip install torch==2.13.0 -e '.[dev,quanto,llamacpp,docs]'"]
    assert "pytest -n 2" in (REPO / ".ci" / "run").read_text().splitlines()


def test_main_command_runs_the_suites() -> None:
    main_cmd = next(c for c in readme_commands() if c.text.startswith("pytest suites -n 2"))
    assert "pip install torch==2.13.0" in main_cmd.install and main_cmd.kind == "expensive"
