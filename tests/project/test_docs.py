"""The docs site and the README name only what exists: the options reference is generated from the plugin's own
``pytest_addoption`` and lists every option; every ``--kvaudit-*`` option, ``KVAUDIT_*`` variable and repository
path that README.md or docs/ names exists; the schema pages list the keys the code writes; no development-log
words. Each check is also shown to fail on a page that breaks it."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from kvtest import REPO

DOCS = REPO / "docs"
OPTION = re.compile(r"--kvaudit-[a-z0-9-]*[a-z0-9]")
ENV = re.compile(r"\bKVAUDIT_[A-Z0-9_]*[A-Z0-9]")
#: a repository path as the docs write it (a folder the repository has, then its parts)
PATH = re.compile(r"(?<![\w/.$~-])"
                  r"((?:benchmarks|scripts|fixtures|suites|tests|pytest_kvaudit|docs|\.ci|snapshots/embedded)"
                  r"(?:/[\w.*-]+)*/?)")
#: words of the development log, and a machine left unnamed
DEV_LOG = re.compile(r"\bsessions?\b|\bIssue \d|\blent\b|\bthis (?:CPU|machine|Xeon|EPYC)\b"
                     r"|\bthe issue(?:'s)?\b(?! \d)|\bnot (?:measured|run|tried) yet\b|\bup to \d{4}-\d\d-\d\d\b"
                     r"|\bsince then\b|\bsuperseded\b|\bunder the hour\b", re.I)
#: words of the team that wrote it, in the site's config and in the notes folder
WORKFLOW = re.compile(r"\bhelpers?\b|\bintegrator\b|\bbranch(?:es)?\b", re.I)
#: wording that claims no move, or no disagreement at all, which no decision rule here can show: a rule shows a
#: move smaller than a margin, a rate below a threshold. A paragraph that says why the rule cannot show it may
#: use them (it names "cannot show")
TOO_STRONG = re.compile(r"accuracy does not\b|does not move|\bhas none\b|shows none|\bdo not move", re.I)
#: the machines table's names
MACHINES = ("Intel Xeon (AMX)", "AMD EPYC (AVX512-BF16)", "AMD EPYC (AVX2)", "NVIDIA H200")


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


ref = _reference()


def pages() -> list[Path]:
    """README and every page of the site (docs/_incoming/ holds notes, not pages)."""
    return [REPO / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "_incoming" not in p.parts)]


def all_pages() -> list[Path]:
    """The pages, and the READMEs of the benchmarks and their results, which the pages point to."""
    return [*pages(), REPO / "benchmarks" / "README.md", *sorted((REPO / "benchmarks" / "results").glob("*/README.md"))]


def known_options(config: pytest.Config) -> set[str]:
    return {"--" + d.replace("_", "-") for d in vars(config.option) if d.startswith("kvaudit_")}


def missing_options(text: str, known: set[str]) -> set[str]:
    """Options that have no row (a backticked flag opening a table cell) in a reference."""
    return {f for f in known if not re.search(rf"^\| `{re.escape(f)}[=`]", text, re.M)}


def unknown_options(text: str, known: set[str]) -> set[str]:
    return set(OPTION.findall(text)) - known


def missing_paths(text: str) -> set[str]:
    return {p for p in PATH.findall(text) if not any(REPO.glob(p.rstrip("/")))}


def code_env() -> set[str]:
    return {v for f in (REPO / "pytest_kvaudit").rglob("*.py") for v in ENV.findall(f.read_text())}


def headings(text: str, level: str = "###") -> set[str]:
    return set(re.findall(rf"^{level} `(\w+)`$", text, re.M))


# -- the options reference -------------------------------------------------------------------------------------------
def test_the_reference_lists_every_option_with_its_ini_twin(pytestconfig: pytest.Config) -> None:
    known = known_options(pytestconfig)
    assert len(known) > 30, known  # the plugin is loaded, so this is the whole set
    table = ref.options_markdown()
    assert missing_options(table, known) == set()
    assert unknown_options(table, known) == set()
    for flag in known:
        key = flag.lstrip("-").replace("-", "_")
        pytestconfig.getini(key)  # the ini twin exists (an unknown key raises)
        assert re.search(rf"^\| `{flag}[=`].*\| `{key}` \|", table, re.M), flag
    # the value as --help names it: a declared metavar, and a value that may be left out in brackets
    assert "| `--kvaudit-engine-arg=KEY=VALUE` |" in table
    assert "| `--kvaudit-chat-template=[VALUE]` |" in table
    # the site renders it where the reference page asks for it
    assert "<!-- kvaudit:options -->" in (DOCS / "reference" / "options.md").read_text()


def test_the_reference_check_fails_on_a_missing_or_invented_option(pytestconfig: pytest.Config) -> None:
    known = known_options(pytestconfig)
    table = ref.options_markdown()
    without_seed = "\n".join(line for line in table.splitlines() if not line.startswith("| `--kvaudit-seed="))
    assert missing_options(without_seed, known) == {"--kvaudit-seed"}
    assert unknown_options(table + "\n| `--kvaudit-batch-size=VALUE` | |\n", known) == {"--kvaudit-batch-size"}


def test_an_option_added_to_the_plugin_appears_without_a_hand_edit() -> None:
    rec = ref.declared()
    rec.addoption("--kvaudit-new-thing", dest="kvaudit_new_thing", default=None, help="a new option (default: 7)")
    rec.addini("kvaudit_new_thing", "a new option (default: 7)")
    rec.options[-1].ini = "kvaudit_new_thing"
    assert "| `--kvaudit-new-thing=VALUE` | `kvaudit_new_thing` | 7 | a new option (default: 7) |" in (
        ref.options_markdown(rec))


def test_docs_name_only_options_that_exist(pytestconfig: pytest.Config) -> None:
    known = known_options(pytestconfig)
    bad = {str(p.relative_to(REPO)): sorted(u) for p in all_pages() if (u := unknown_options(p.read_text(), known))}
    assert bad == {}


def test_an_unknown_marker_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match="kvaudit:optoins"):
        ref.expand("<!-- kvaudit:optoins -->")


# -- claims ----------------------------------------------------------------------------------------------------------
def test_every_built_in_claim_has_its_page_and_every_claim_page_a_claim() -> None:
    from pytest_kvaudit.claims import registered

    names = {c.name for c in registered()}
    pages_ = {p.stem for p in (DOCS / "claims").glob("*.md")} - {"index", "analyses"}
    assert pages_ == names
    for name in names:
        text = (DOCS / "claims" / f"{name}.md").read_text()
        assert f"<!-- kvaudit:claim {name} -->" in text and f"::: pytest_kvaudit.claims.{name}" in text
        generated = ref.expand(text)
        for key in next(c for c in registered() if c.name == name).thresholds:
            assert f"`{name}.{key}`" in generated


# -- environment variables -------------------------------------------------------------------------------------------
def test_the_environment_page_lists_exactly_the_variables_the_package_reads() -> None:
    documented = set(re.findall(r"^\| `(KVAUDIT_\w+)` \|", (DOCS / "reference" / "environment.md").read_text(), re.M))
    assert documented == code_env()
    assert "KVAUDIT_LLAMACPP_N_CTX" in documented


def test_docs_name_only_variables_that_exist() -> None:
    tests_env = {v for f in (REPO / "tests").rglob("*.py") if f.name != "test_docs.py"
                 for v in ENV.findall(f.read_text())}
    real = code_env() | tests_env
    bad = {str(p.relative_to(REPO)): sorted(u) for p in all_pages() if (u := set(ENV.findall(p.read_text())) - real)}
    assert bad == {}
    assert set(ENV.findall("KVAUDIT_VLLM_BATCH=4 pytest")) - real == {"KVAUDIT_VLLM_BATCH"}


# -- paths -----------------------------------------------------------------------------------------------------------
def test_docs_name_only_repository_paths_that_exist() -> None:
    bad = {str(p.relative_to(REPO)): sorted(m) for p in all_pages() if (m := missing_paths(p.read_text()))}
    assert bad == {}


def test_the_path_check_fails_on_a_path_that_does_not_exist() -> None:
    assert missing_paths("python benchmarks/nope.py && pytest suites/test_ledger_audit.py") == {"benchmarks/nope.py"}
    assert missing_paths("--kvaudit-snapshots=benchmarks/results/smollm2-v3/snapshots") == set()


# -- schemas ---------------------------------------------------------------------------------------------------------
def test_the_report_page_lists_the_keys_the_report_builder_writes() -> None:
    from pytest_kvaudit.report.document import build

    written = set(build({}, {}, {}, {}, {})) | {"baseline"}  # baseline: session_report adds it under --kvaudit-baseline
    assert headings((DOCS / "reference" / "report.md").read_text()) == written


def test_the_ledger_page_lists_the_keys_of_the_committed_ledger() -> None:
    ledger = json.loads((REPO / "snapshots/embedded/test_ledger_audit/test_ledger_audit.json").read_text())
    top, unit = (DOCS / "reference" / "ledger.md").read_text().split("## A unit")
    assert headings(top) == set(ledger)
    assert headings(unit) == {k for u in ledger["units"].values() for k in u}


# -- prose no stronger than the rules ------------------------------------------------------------------------------
def too_strong(text: str) -> list[str]:
    """The phrases of :data:`TOO_STRONG`, outside paragraphs (and comment blocks) that explain why a rule cannot
    show them."""
    return [m.group(0) for par in re.split(r"\n\s*\n", text) if "cannot show" not in par
            for m in TOO_STRONG.finditer(par)]


def test_the_prose_says_what_the_rules_show() -> None:
    sources = [*all_pages(), *sorted((REPO / "pytest_kvaudit" / "claims").glob("*.py"))]
    bad = {str(p.relative_to(REPO)): found for p in sources if (found := too_strong(p.read_text()))}
    assert bad == {}


def test_the_prose_check_fails_on_a_claim_no_rule_can_show() -> None:
    assert too_strong("Suffixes move, accuracy does not.\n\nFP32 has none.") == ["accuracy does not", "has none"]
    assert too_strong("A finite run cannot show that accuracy does not move: it shows a move below 6 points.") == []
    assert too_strong("accuracy moved less than 6 points (95%); FP32 disagreement below 2% (97.5%)") == []


# -- the site's shape ------------------------------------------------------------------------------------------------
def nav_pages(nav: list) -> set[str]:
    out: set[str] = set()
    for entry in nav:
        for v in entry.values() if isinstance(entry, dict) else [entry]:
            out |= nav_pages(v) if isinstance(v, list) else {v}
    return out


def test_every_page_is_in_the_nav_and_every_nav_entry_a_page() -> None:
    cfg = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    on_disk = {str(p.relative_to(DOCS)) for p in pages()[1:]}
    assert nav_pages(cfg["nav"]) == on_disk
    assert cfg["theme"]["font"] is False and "_incoming/" in cfg["exclude_docs"]


def test_readme_is_a_landing_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 190  # a landing page, with a first run and what it prints
    assert "## A first run" in "\n".join(lines[:30])  # the command itself: tests/project/test_doc_commands.py
    head = "\n".join(lines[:130])
    for quickstart in ("**Gate a checkpoint in CI.**", "**Audit vLLM's prefix cache.**",
                       "**Reproduce the paper's table**"):
        assert quickstart in head, quickstart
    assert "](docs/limitations.md)" in "\n".join(lines)
    text = "\n".join(lines)
    assert "pip install pytest-kvaudit" not in text and "pip install 'pytest-kvaudit" not in text
    # the site's home page is the README itself, its links made the site's
    home = ref.expand((DOCS / "index.md").read_text())
    assert "## Quickstarts" in home and "](docs/" not in home and "](guides/ci-gate.md)" in home


def test_no_development_log_words_and_every_results_page_dated_on_a_named_machine() -> None:
    bad = {str(p.relative_to(REPO)): DEV_LOG.findall(p.read_text()) for p in all_pages()
           if DEV_LOG.search(p.read_text())}
    assert bad == {}
    for page in (DOCS / "results").glob("*.md"):
        if page.name == "index.md":
            continue
        text = page.read_text()
        assert re.search(r"\*\*Date:\*\*\s+\d{4}-\d\d-\d\d", text), page.name
        assert re.search(r"\*\*Machine:\*\*\s+(" + "|".join(map(re.escape, MACHINES)) + ")", text), page.name
    assert DEV_LOG.findall("the session that ran it, Issue 30, no GPU was lent, on this CPU") == [
        "session", "Issue 3", "lent", "this CPU"]
    assert DEV_LOG.findall("over the issue's hour; the issue asked for it (not measured yet). Up to 2026-12-07 it "
                           "read K so; since then, superseded, under the hour") == [
        "the issue's", "the issue", "not measured yet", "Up to 2026-12-07", "since then", "superseded",
        "under the hour"]


def test_the_site_config_and_the_notes_folder_speak_of_the_project_not_its_team() -> None:
    for f in (REPO / "mkdocs.yml", DOCS / "_incoming" / "README.md"):
        assert WORKFLOW.findall(f.read_text()) == [], f
    assert WORKFLOW.findall("the helpers' notes wait for the integrator; each branch") == [
        "helpers", "integrator", "branch"]


#: a merge's conflict markers, left on a line of their own
CONFLICT = re.compile(r"^(?:<{7}|={7}|>{7})(?: |$)", re.M)


def test_no_page_keeps_a_merge_conflict_marker() -> None:
    """A conflict resolved by hand once left README's first-run excerpt with a ``=======`` line and two summaries."""
    assert [str(p.relative_to(REPO)) for p in all_pages() if CONFLICT.search(p.read_text())] == []
    assert CONFLICT.search("a\n=======\nb") and not CONFLICT.search("==== 2 passed ====")
