"""Every shell command that README.md and docs/ show, read from their ```bash blocks, each with how CI runs it.

``tests/project/test_doc_commands.py`` runs what this module finds, so a command on a page is tested as it is
written there, never as a copy in a test. ``python scripts/doc_commands.py`` prints the list.

A page marks a command with a shell comment that a reader sees too, trailing the command or on a line of its own
(then it marks every command below it in the block):

- ``# expensive: WHY`` -- run with a smaller n (``--kvaudit-n``, ``--n``, or ``N=`` for a results script), in CI
  too; ``KVAUDIT_DOC_COMMANDS_EXPENSIVE=0`` lists it as skipped instead, with WHY (a quick local run);
- ``# fails: WHY`` -- it runs as written and must exit 1: the page shows a finding, a claim that fails (a BF16
  finding that this CPU does not show at the page's n exits 0: listed as skipped with that reason);
- ``# expensive, fails: WHY`` -- both: run with a smaller n, and it exits 1 where the finding shows on those items
  (a claim's FAIL, never an error); where it does not show at the smaller n, the run exits 0 and is listed as
  skipped, saying so;
- ``# CI skips: WHY`` -- CI lists it as skipped, with WHY as the reason (a GPU, a checkpoint of yours, a server,
  CI's own command).

Anything else runs as written and must exit 0. A command belongs to the install line above it on its page (a line
that makes a venv or runs ``pip install``; on a page without one, the install line of docs/install.md): README's
first run runs in a fresh copy of the checkout with a venv made by its install line as written; every other line
runs in the venv .ci/run built with the same or more extras, in this checkout, and is held to the extras its
commands need (``NEEDS``); on a page that shows a test file (a ```python block opening with
``# test_NAME.py``), from a folder holding only the files shown above it, as a user's project would. A line that
only sets a variable (``SMOLLM2_DIR=$(python scripts/smollm2.py)``) runs once and is set again before every later
command of its page, up to the next line that makes a venv.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^```bash[^\n]*\n(.*?)^```", re.S | re.M)
TAG = re.compile(r"(?:^|\s)#\s*(expensive, fails|expensive|fails|CI skips):\s*(.*)$")
SETUP = re.compile(r"^(?:python3? -m venv |\. \S+/bin/activate$|source \S+/bin/activate$|pip (?:install|uninstall) )")
ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=(?:\$\((?:[^()]|\$\([^()]*\))*\)|[^\s$]|\$\w)+$")
VENV = re.compile(r"python3? -m venv (\S+)")

RUN, EXPENSIVE, FAILS, SKIP, SETUP_KIND, DEFINE = "run", "expensive", "fails", "skip", "setup", "define"
#: an expensive command that shows a finding: run at a smaller n, exits 1 where the finding shows there
EXPENSIVE_FAILS = "expensive, fails"
FILE = re.compile(r"^```python\n# (test_\w+\.py)\b[^\n]*\n(.*?)^```", re.S | re.M)


@dataclass(frozen=True)
class Command:
    """One command of a page: where it is, what it says, and how CI treats it."""

    page: str          #: the page, relative to the repository
    line: int          #: its first line on the page
    text: str          #: the command as written, continuation lines joined, its tag comment dropped
    kind: str          #: run, expensive, fails, "expensive, fails", skip, setup (an install line) or define (sets one)
    reason: str = ""   #: the tag's words (why expensive, why not run)
    install: str = ""  #: the install line it runs under
    prelude: tuple[str, ...] = ()  #: the page's variable lines above it
    files: tuple[tuple[str, str], ...] = ()  #: (name, text) of the test files the page shows above it

    @property
    def expensive(self) -> bool:
        """Whether CI runs it at a smaller n."""
        return self.kind in (EXPENSIVE, EXPENSIVE_FAILS)

    @property
    def fails(self) -> bool:
        """Whether it shows a finding: a claim that fails, so the run exits 1."""
        return self.kind in (FAILS, EXPENSIVE_FAILS)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def venv(self) -> str:
        """The venv folder the install line makes (relative to the checkout)."""
        m = VENV.search(self.install)
        return m.group(1) if m else ".venv"


def pages() -> list[Path]:
    """README and every page of the site (docs/_incoming/ holds notes, not pages)."""
    docs = REPO / "docs"
    return [REPO / "README.md", *sorted(p for p in docs.rglob("*.md") if "_incoming" not in p.parts)]


def logical_lines(block: str, first: int) -> list[tuple[int, str]]:
    """(line number, text) of each line, a line ending in a backslash joined with the next."""
    out: list[tuple[int, str]] = []
    start, acc = 0, ""
    for i, raw in enumerate(block.splitlines()):
        if not acc:
            start = i
        acc = f"{acc}\n{raw}" if acc else raw
        if not raw.rstrip().endswith("\\"):
            out.append((first + start, acc))
            acc = ""
    if acc:
        out.append((first + start, acc))
    return out


def split_setup(text: str) -> tuple[str, str]:
    """A line's leading install steps (joined by ``&&``) and the command after them."""
    parts = [p.strip() for p in re.split(r"\s*(?:\\\n\s*)?&&\s*", text)]
    n = 0
    while n < len(parts) and SETUP.match(parts[n]):
        n += 1
    return " && ".join(parts[:n]), " && ".join(parts[n:])


def default_install() -> str:
    """docs/install.md's install line: what a page that gives none runs under."""
    for cmd in page_commands(REPO / "docs" / "install.md", ""):
        if cmd.kind == SETUP_KIND:
            return cmd.text
    raise ValueError("docs/install.md gives no install line")


def page_commands(page: Path, install: str | None = None) -> list[Command]:
    """The commands of one page in order, each with its kind, install line and variable lines."""
    text = page.read_text()
    rel = str(page.relative_to(REPO))
    current = default_install() if install is None else install
    prelude: dict[str, str] = {}
    out: list[Command] = []
    files = [(f.start(), f.group(1), f.group(0).split("\n", 1)[1].rsplit("```", 1)[0]) for f in FILE.finditer(text)]
    for m in FENCE.finditer(text):
        first = text[: m.start(1)].count("\n") + 1
        shown = tuple((name, body) for at, name, body in files if at < m.start())
        block_tag: tuple[str, str] | None = None
        for line, raw in logical_lines(m.group(1), first):
            stripped = raw.strip()
            if not stripped:
                continue
            tag = TAG.search(raw)
            if stripped.startswith("#"):
                if tag:
                    block_tag = (tag.group(1), tag.group(2).strip())
                continue
            body = raw[: tag.start()].rstrip() if tag else raw.rstrip()
            kind_reason = (tag.group(1), tag.group(2).strip()) if tag else block_tag
            kind = {None: RUN, "expensive": EXPENSIVE, "fails": FAILS, "expensive, fails": EXPENSIVE_FAILS,
                    "CI skips": SKIP}[kind_reason and kind_reason[0]]
            reason = kind_reason[1] if kind_reason else ""
            setup, rest = split_setup(body.strip())
            install = (setup if VENV.search(setup) else f"{current} && {setup}") if setup else current
            if kind != SKIP:
                current = install  # a skipped line's install is its own, not the page's
                if setup and VENV.search(setup):
                    prelude.clear()  # a new venv: the variables set before it belong to another job
            if setup and not rest:
                out.append(Command(rel, line, setup, SKIP if kind == SKIP else SETUP_KIND, reason, install))
                continue
            body = rest if setup else body.strip()
            if ASSIGN.match(body) and kind == RUN:
                out.append(Command(rel, line, body, DEFINE, "", install, tuple(prelude.values()), shown))
                prelude[body.split("=", 1)[0]] = body
                continue
            out.append(Command(rel, line, body, kind, reason, install, tuple(prelude.values()), shown))
    return out


def commands() -> list[Command]:
    """Every command of README.md and the docs site."""
    return [c for p in pages() for c in page_commands(p)]


def pip_steps(text: str) -> list[str]:
    """The pip commands of an install line, as comparable words (no -q, no venv prefix)."""
    steps = []
    for part in re.split(r"\s*(?:\\\n\s*)?&&\s*|\n", text):
        part = re.sub(r"^\S*/bin/(pip|python -m pip)", "pip", part.strip())
        if part.startswith("pip ") and "--upgrade pip" not in part:
            steps.append(" ".join(w for w in part.split() if w not in ("-q", "-y")))
    return steps


def built_by_ci(install: str, venv: str) -> Path | None:
    """The venv .ci/run builds with exactly these pip steps, if it builds one (the main one, .venv, with plain
    ``pip``; another through its own ``VENV/bin/pip``)."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    own = "pip " if venv == ".venv" else f"{venv}/bin/"
    if pip_steps("\n".join(ln.strip() for ln in ci if ln.strip().startswith(own))) != pip_steps(install):
        return None
    return Path(sys.prefix) if venv == ".venv" else REPO / venv


EXTRAS = re.compile(r"-e '\.\[([\w,-]+)\]'")

#: what a command needs from an extra, read from its text (the README's extras table says the same)
NEEDS = {r"scripts/smollm2\.py|benchmarks/items_smollm2\.py|\.gguf\b": "gguf",
         r"--kvaudit-backend=llama\.cpp": "llamacpp", r"quantized:quanto": "quanto",
         r"--kvaudit-backend=vllm|benchmarks/results/vllm-": "vllm-cpu", r"(?:^|\s)-n \d": "xdist"}


def extras(install: str) -> set[str]:
    """The extras an install line asks for (``-e '.[a,b]'``)."""
    return {e for m in EXTRAS.finditer(install) for e in m.group(1).split(",")}


def ci_extras(venv: str) -> set[str]:
    """The extras .ci/run installs into ``venv``."""
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    own = "pip " if venv == ".venv" else f"{venv}/bin/"
    return extras("\n".join(ln.strip() for ln in ci if ln.strip().startswith(own)))


def requirements(names: set[str]) -> set[str]:
    """The packages these extras install, as the installed package's metadata lists them (``dev`` holds
    ``xdist``'s and ``gguf``'s packages under its own name: a venv made with ``dev`` has what a line asking for
    ``xdist,gguf`` needs). An extra that the package does not declare stands for itself, never covered."""
    declared: dict[str, set[str]] = {}
    for line in metadata.requires("pytest-kvaudit") or []:
        req, _, marker = line.partition(";")
        for extra in re.findall(r"""extra\s*==\s*["']([\w.-]+)["']""", marker):
            declared.setdefault(extra, set()).add(req.strip())
    return {r for n in names for r in declared.get(n, {f"<undeclared extra {n}>"})}


def covered_by_ci(install: str, venv: str) -> bool:
    """Whether the venv .ci/run builds under this name holds every package the install line's extras ask for."""
    return requirements(extras(install)) <= requirements(ci_extras(venv))


def missing_extras(cmd: Command) -> set[str]:
    """The extras that ``cmd`` (and the variable lines it runs first) needs and its install line lacks."""
    text = "\n".join((*cmd.prelude, cmd.text))
    return {extra for pat, extra in NEEDS.items() if re.search(pat, text)} - extras(cmd.install)


REDUCE = (re.compile(r"--kvaudit-n=\d+"), re.compile(r"(?<=\s)--n \d+"), re.compile(r"(?<=\s)--n=\d+"))


def reduced(text: str, n: int) -> str:
    """An expensive command at n items: its ``--kvaudit-n``/``--n`` set to n, a pytest run that names none given
    one, a results script (``bash benchmarks/results/*/run.sh``) given ``N=n``."""
    for pat, new in zip(REDUCE, (f"--kvaudit-n={n}", f"--n {n}", f"--n={n}")):
        if pat.search(text):
            return pat.sub(new, text)
    if re.search(r"(?:^|&& )bash benchmarks/results/", text):
        return re.sub(r"(^|&& )bash benchmarks/results/", rf"\1N={n} bash benchmarks/results/", text)
    if re.search(r"(?:^|\s)pytest(?=\s|$)", text):
        return re.sub(r"(^|\s)pytest(?=\s|$)", rf"\1pytest --kvaudit-n={n}", text, count=1)
    raise ValueError(f"{text!r} is marked expensive but has no n to reduce")


def main() -> int:
    for c in commands():
        note = f" ({c.reason})" if c.reason else ""
        print(f"{c.id:38} {c.kind:9} {c.text.splitlines()[0][:90]}{note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
