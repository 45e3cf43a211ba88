"""The README's example claim runs as written, and its commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REPO

README = (REPO / "README.md").read_text()


def block_after(heading: str, lang: str) -> str:
    section = README.split(heading, 1)[1]
    m = re.search(rf"```{lang}\n(.*?)```", section, re.S)
    assert m, f"no ```{lang} block after {heading!r}"
    return m.group(1)


def test_write_your_own_claim_example_runs(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_chunked_claim=block_after("## Write your own claim", "python"))
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-chunks=4",
                                        "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*chunked4_equals_prefill*PASS*8/8*"])


def test_the_example_claim_fails_when_the_construction_breaks(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    pytester.makepyfile(test_chunked_claim=block_after("## Write your own claim", "python"))
    pytester.makeconftest(
        "import torch\nfrom pytest_kvaudit import cache as kv\nfrom pytest_kvaudit.store import Store\n"
        "def hook(c, path):\n"
        "    if path == 'chunked(4)':\n"
        "        for k, v in kv.layer_kv(c):\n"
        "            k.add_(8 * torch.randn(k.shape, generator=torch.Generator().manual_seed(1)).to(k.dtype))\n"
        "Store.state_hook = hook\n"
    )
    res = pytester.runpytest_subprocess(f"--kvaudit-model={tiny_llama}", "--kvaudit-n=4", "--kvaudit-chunks=4",
                                        "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*chunked4_equals_prefill FAILED: fails on t0*"])


def test_ci_runs_the_readme_test_command() -> None:
    tests_cmd = block_after("Run kvaudit's own tests", "bash").strip()
    ci = (REPO / ".ci" / "run").read_text()
    install, _, run = tests_cmd.partition(" && pytest")
    assert "pip install torch==2.13.0 -e '.[dev]'" in install and "pip install -q torch==2.13.0 -e '.[dev]'" in ci
    assert f"pytest{run}" in ci.splitlines()


def test_main_command_runs_the_suites() -> None:
    main_cmd = block_after("## The two commands", "bash")
    assert "pip install torch==2.13.0" in main_cmd and "pytest suites" in main_cmd
