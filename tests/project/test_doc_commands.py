"""Every command that README.md and docs/ show runs as written (scripts/doc_commands.py reads them from the pages;
nothing here copies one): README's first run in a venv that its install line makes in a fresh copy of the
checkout, the others in the venvs .ci/run built, each install line held to the extras its commands need.

A command marked ``# expensive:`` runs at ``--kvaudit-n=REDUCED_N`` (the test's id says so), in CI too
(``KVAUDIT_DOC_COMMANDS_EXPENSIVE=0`` lists it as skipped instead, for a quick local run); one marked
``# fails:`` must exit 1 (the page shows a finding); one marked ``# CI skips:`` is listed as skipped with the
page's reason (``pytest -rs`` prints it). An install line that .ci/run already built (the dev venv, .venv-vllm)
is not built twice; any other is built once, as written, in a fresh copy of the checkout."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvtest import REPO, script

#: the n at which CI runs a command that its page marks ``# expensive:``
REDUCED_N = 1
#: set to 0 to list the commands marked ``# expensive:`` as skipped instead of running them at REDUCED_N (CI runs them)
RUN_EXPENSIVE = "KVAUDIT_DOC_COMMANDS_EXPENSIVE"
#: the most one command may take here (an expensive one at REDUCED_N included)
TIMEOUT_S = 900


dc = script("doc_commands")
COMMANDS = dc.commands()


def _first_of_each() -> dict[str, str]:
    """Each command's id -> the id of the first command that runs the same thing (the same install line, variable
    lines, files and text as CI runs it): that one runs, the others name it."""
    first: dict[tuple, str] = {}
    out = {}
    for c in COMMANDS:
        text = dc.reduced(c.text, REDUCED_N) if c.expensive else c.text
        out[c.id] = first.setdefault((c.install, c.prelude, c.files, c.kind, text), c.id)
    return out


SAME_AS = _first_of_each()


def _id(c) -> str:  # noqa: ANN001
    return f"{c.id} {c.kind}" + (f" n={REDUCED_N}" if c.expensive else "")


def copy_checkout(dest: Path) -> Path:
    """The checkout as a fresh clone would have it (tracked and unignored files, as they are now)."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    return dest


def clean_env(cache: Path | None = None) -> dict[str, str]:
    """The environment a user's shell has: none of this run's pytest or venv settings. ``cache`` is the
    install line's own KVAUDIT_CACHE, so that a venv fetches and converts SmolLM2 itself (a warm cache would
    hide a missing extra: the conversion needs ``gguf``)."""
    drop = ("PYTEST_ADDOPTS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT",
            "VIRTUAL_ENV", "PYTHONPATH", "KVAUDIT_CACHE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if cache is not None:
        env["KVAUDIT_CACHE"] = str(cache)
    return env


def fresh(cmd) -> bool:  # noqa: ANN001
    """Whether CI builds ``cmd``'s venv from its install line as written: README's first run's line, the one a
    newcomer types. Every other line runs in the venv .ci/run built with the same pip steps, or with a superset of
    its extras' packages (``test_every_command_asks_its_install_line_for_the_extras_it_needs`` holds each line to
    what its commands need); building one venv per line would cost CI minutes each."""
    first = next(c for c in COMMANDS if c.page == "README.md" and c.kind == dc.SETUP_KIND)
    return cmd.install == first.install


class Venvs:
    """The venv each command runs in; a fresh one is built once per install line, shared by the xdist workers
    (under a file lock)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def ci_venv(self, cmd) -> Path | None:  # noqa: ANN001
        if fresh(cmd):
            return None
        same = dc.built_by_ci(cmd.install, cmd.venv)
        if same is not None:
            return same
        if dc.covered_by_ci(cmd.install, cmd.venv):
            return Path(sys.prefix) if cmd.venv == ".venv" else REPO / cmd.venv
        return None

    def cache(self, cmd) -> Path | None:  # noqa: ANN001
        """A fresh venv's own KVAUDIT_CACHE: it fetches and converts SmolLM2 itself (a warm cache would hide a
        missing ``gguf``); a CI venv shares the user's cache."""
        key = hashlib.sha256(cmd.install.encode()).hexdigest()[:12]
        return None if self.ci_venv(cmd) else self.root / f"cache-{key}"

    def checkout(self, cmd) -> Path:  # noqa: ANN001
        """The checkout that ``cmd``'s venv installed kvaudit from: this one for a venv .ci/run built, else the
        fresh copy its install line ran in."""
        return REPO if self.ci_venv(cmd) else self.get(cmd).parent

    def get(self, cmd) -> Path:  # noqa: ANN001
        ci = self.ci_venv(cmd)
        if ci is not None:
            if not (ci / "bin" / "activate").is_file():
                pytest.skip(f"{cmd.venv} is not built here: .ci/run builds it")
            return ci
        from filelock import FileLock

        key = hashlib.sha256(cmd.install.encode()).hexdigest()[:12]
        home, log = self.root / f"venv-{key}", self.root / f"venv-{key}.log"
        with FileLock(str(self.root / f"venv-{key}.lock")):
            if not (home / "ok").exists():
                if home.exists():
                    pytest.fail(f"the install line failed before:\n{cmd.install}\n{log.read_text()[-3000:]}")
                copy_checkout(home)
                res = subprocess.run(["bash", "-e", "-c", cmd.install], cwd=home, env=clean_env(), text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
                log.write_text(res.stdout)
                assert res.returncode == 0, f"the install line failed:\n{cmd.install}\n{res.stdout[-3000:]}"
                (home / "ok").touch()
        return home / cmd.venv


@pytest.fixture(scope="session")
def venvs(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Venvs:
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "doc-venvs"
    root.mkdir(exist_ok=True)
    return Venvs(root)


def script(cmd, venv: Path, text: str) -> str:  # noqa: ANN001
    return "\n".join(["set -eo pipefail", f". {venv}/bin/activate", *cmd.prelude, text])


def ended_in_error(output: str) -> bool:
    """Whether a pytest run's closing summary counts an error (``-q``'s summary has no ``=`` around it)."""
    return re.search(r"^(?:=+ )?[\w ,]*\b\d+ errors?\b[\w ,]* in [\d.]+s", output, re.M) is not None


@pytest.mark.parametrize("cmd", COMMANDS, ids=_id)
def test_the_command_runs_as_written(cmd, venvs: Venvs, tmp_path: Path) -> None:  # noqa: ANN001
    if cmd.kind == dc.SKIP:
        pytest.skip(f"{cmd.id}: {cmd.reason}")
    if SAME_AS[cmd.id] != cmd.id:
        pytest.skip(f"{cmd.id}: the same command as {SAME_AS[cmd.id]}, which runs it")
    if cmd.expensive and os.environ.get(RUN_EXPENSIVE, "1") == "0":
        pytest.skip(f"{cmd.id}: expensive ({cmd.reason}); {RUN_EXPENSIVE}=0 skips it (CI runs it at n={REDUCED_N})")
    venv = venvs.get(cmd)
    if cmd.kind == dc.SETUP_KIND:
        return  # the install line built the venv (or .ci/run did, with the same steps)
    if cmd.files:  # a user's project: a folder with the files the page shows
        for name, body in cmd.files:
            (tmp_path / name).write_text(body)
        cwd = tmp_path
    else:  # the checkout the venv was made in (its package and its suites/ are one)
        cwd = venvs.checkout(cmd)
    text = dc.reduced(cmd.text, REDUCED_N) if cmd.expensive else cmd.text
    res = subprocess.run(["bash", "-c", script(cmd, venv, text)], cwd=cwd, env=clean_env(venvs.cache(cmd)), text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
    print(f"$ {text}\n{res.stdout[-4000:]}")
    want = 1 if cmd.fails else 0
    if cmd.fails and res.returncode == 0:
        # a shown finding is a BF16 one (BF16 bits depend on the CPU), or one that an expensive command's fewer items
        # may not hold: where this run parts no continuation at its n, it passes; that is listed (pytest -rs), never
        # counted as the page's failure shown
        pytest.skip(f"{cmd.id}: the page shows a failure ({cmd.reason}); here the run passed, so the finding "
                    "did not show at its n" + (f" ({REDUCED_N})" if cmd.expensive else ""))
    if cmd.fails:  # a finding is a claim's FAIL: an error (a setup error also exits 1) is no finding
        assert not ended_in_error(res.stdout), f"{cmd.id}: an error, not a claim's failure:\n$ {text}\n" \
                                               f"{res.stdout[-4000:]}"
    assert res.returncode == want, f"{cmd.id}: exit {res.returncode}, the page says {want}:\n$ {text}\n" \
                                   f"{res.stdout[-4000:]}"


# -- the reader, on pages made up here ------------------------------------------------------------------------------
def page(tmp_path: Path, text: str):  # noqa: ANN201
    p = tmp_path / "page.md"
    p.write_text(text)
    dc.REPO, old = tmp_path, dc.REPO
    try:
        return dc.page_commands(p, "python3 -m venv .venv && pip install -e .")
    finally:
        dc.REPO = old


def test_the_reader_finds_each_command_with_its_mark(tmp_path: Path) -> None:
    cmds = page(tmp_path, "x\n```bash\npython3 -m venv .v && . .v/bin/activate && pip install -e '.[a]' && pytest -q\n"
                          "X=$(python scripts/smollm2.py)\n"
                          "pytest --kvaudit-model=$X \\\n  --kvaudit-n=200   # expensive: an hour\n"
                          "pytest --kvaudit-model=/models/mine   # CI skips: your checkpoint\n```\n"
                          "```bash\n# CI skips: needs a GPU\npytest --kvaudit-device=cuda\n```\n")
    assert [(c.line, c.kind) for c in cmds] == [(3, "run"), (4, "define"), (5, "expensive"), (7, "skip"),
                                                 (11, "skip")]
    first, _, expensive, mine, gpu = cmds
    assert first.text == "pytest -q" and first.install.endswith("pip install -e '.[a]'") and first.venv == ".v"
    assert expensive.prelude == ("X=$(python scripts/smollm2.py)",) and expensive.reason == "an hour"
    assert dc.reduced(expensive.text, 2) == "pytest --kvaudit-model=$X \\\n  --kvaudit-n=2"
    assert mine.reason == "your checkpoint" and gpu.reason == "needs a GPU"


def test_a_new_venv_starts_a_new_job(tmp_path: Path) -> None:
    cmds = page(tmp_path, "```bash\nX=$(python scripts/smollm2.py)\npytest --kvaudit-model=$X\n```\n"
                          "```bash\npython3 -m venv .venv && pip install -e . && pytest suites\n```\n")
    assert cmds[1].prelude == ("X=$(python scripts/smollm2.py)",) and cmds[2].prelude == ()


def test_an_expensive_command_without_an_n_is_refused() -> None:
    assert dc.reduced("pytest suites -n 2", 3) == "pytest --kvaudit-n=3 suites -n 2"
    assert dc.reduced("bash benchmarks/results/x/run.sh out", 3) == "N=3 bash benchmarks/results/x/run.sh out"
    with pytest.raises(ValueError, match="no n to reduce"):
        dc.reduced("mkdocs build", 3)


def test_an_expensive_finding_is_both_reduced_and_expected_to_fail(tmp_path: Path) -> None:
    cmd, = page(tmp_path, "```bash\npytest --kvaudit-n=40 -n 2   # expensive, fails: f32 parts on llama.cpp\n```\n")
    assert (cmd.kind, cmd.expensive, cmd.fails) == ("expensive, fails", True, True)
    assert cmd.reason == "f32 parts on llama.cpp"
    plain, = page(tmp_path, "```bash\npytest --kvaudit-n=40   # expensive: minutes\n```\n")
    assert (plain.expensive, plain.fails) == (True, False)


def test_a_finding_is_a_claims_failure_not_an_error() -> None:
    assert ended_in_error("===== 1 failed, 7 skipped, 1 error in 3.20s =====")
    assert ended_in_error("8 errors in 2.13s")
    assert not ended_in_error("=== 1 failed, 7 skipped in 3.20s ===\nE   KvauditError: an error in 3.2s of text")
    assert not ended_in_error("1 failed, 2 passed, 5 skipped, 1 warning in 12.00s")


def test_a_test_file_shown_on_the_page_travels_with_its_commands(tmp_path: Path) -> None:
    cmds = page(tmp_path, "```python\n# test_mine.py -- a claim\ndef test_x():\n    pass\n```\n"
                          "```bash\npytest --kvaudit-n=4   # fails: the finding\n```\n")
    assert cmds[0].kind == "fails" and cmds[0].files == (("test_mine.py", "# test_mine.py -- a claim\ndef test_x():\n"
                                                                           "    pass\n"),)


def test_every_command_asks_its_install_line_for_the_extras_it_needs() -> None:
    lacking = {c.id: sorted(m) for c in COMMANDS if c.kind not in (dc.SKIP, dc.SETUP_KIND)
               if (m := dc.missing_extras(c))}
    assert lacking == {}


def test_the_extras_check_fails_on_a_line_without_gguf(tmp_path: Path) -> None:
    cmds = page(tmp_path, "```bash\npython3 -m venv .venv && pip install -e '.[xdist]'\n"
                          "SMOLLM2_DIR=$(python scripts/smollm2.py)\n"
                          "pytest suites --kvaudit-model=$SMOLLM2_DIR -n 2\n```\n")
    assert dc.missing_extras(cmds[-1]) == {"gguf"}


def test_ci_venvs_cover_every_install_line_but_the_first_runs() -> None:
    """limitations.md: only README's first run gets a venv of its own install line; each other line runs in a venv
    .ci/run built, which holds every package of its extras (``dev`` holds ``xdist``'s and ``gguf``'s)."""
    assert dc.covered_by_ci("pip install torch==2.13.0 -e '.[xdist,gguf,llamacpp]'", ".venv")
    assert not dc.covered_by_ci("pip install torch==2.13.0 -e '.[xdist,hqq]'", ".venv")
    venvs = Venvs(REPO)
    own = sorted({c.install for c in COMMANDS if c.kind not in (dc.SKIP, dc.DEFINE) and venvs.ci_venv(c) is None})
    assert own == [next(c for c in COMMANDS if c.page == "README.md" and c.kind == dc.SETUP_KIND).install]


def test_the_readme_opens_with_a_command_that_runs() -> None:
    first = next(c for c in COMMANDS if c.page == "README.md" and c.kind not in (dc.SETUP_KIND, dc.DEFINE))
    assert first.kind == dc.RUN and first.line <= 30, first
    assert dc.built_by_ci(first.install, first.venv) is None  # run in a venv of its own install line, not CI's


def test_every_command_is_marked_or_runs_here() -> None:
    """A placeholder left unmarked (a user's checkpoint, a GPU) would fail above; none is silently dropped."""
    unmarked = [c.id for c in COMMANDS if c.kind in (dc.RUN, dc.FAILS)
                and re.search(r"ckpts/|/models/|\bCKPT\b|=DIR\b|\$N\b|--kvaudit-device=cuda|mkdocs serve", c.text)]
    assert unmarked == []
