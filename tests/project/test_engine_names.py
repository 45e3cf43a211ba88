"""An engine is one folder: no module outside ``pytest_kvaudit/engines/<folder>/`` imports that folder or names the
engine in code (an import, a string constant, an f-string's text, an identifier). Docstrings and messages to users
do not count: a string with a space in it is prose, for people. transformers is also the model library the core
loads through, so for it the rule is about its backend and its record, not the library's name."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvtest import REPO

PKG = REPO / "pytest_kvaudit"


@dataclass(frozen=True)
class Rule:
    """An engine's folder under ``pytest_kvaudit/engines/`` and the words that name it in code."""

    folder: str
    words: tuple[str, ...]
    #: vLLM is also spelt VLLM (its record) and vLLM; the transformers engine's words are exact, the library's are not
    ignore_case: bool = True


RULES = (
    Rule("vllm", ("vllm",)),
    Rule("llama_cpp", ("llama.cpp", "llama_cpp", "llamacpp")),
    Rule("transformers_cb", ("transformers-cb", "transformers_cb", "transformerscb")),
    # the library is not the engine: its backend and record are
    Rule("transformers", ("TransformersBackend", "TRANSFORMERS"), ignore_case=False),
)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def code_names(source: str) -> list[tuple[int, str]]:
    """``(line, word)`` of every name in ``source``'s code: imported modules, identifiers, and the string constants
    (f-strings' text included) that are not prose: no docstring, nothing with a space in it."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out += [(node.lineno, f"{node.module or ''}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if not re.search(r"\s", node.value):
                out.append((node.lineno, node.value))
        elif isinstance(node, ast.Name):
            out.append((node.lineno, node.id))
        elif isinstance(node, ast.Attribute):
            out.append((node.lineno, node.attr))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.lineno, node.name))
    return out


def leaks(rule: Rule, source: str) -> list[str]:
    """Where ``source`` (a module outside the engine's folder) imports the folder or names the engine."""
    folder = f"pytest_kvaudit.engines.{rule.folder}"
    words = re.compile("|".join(rf"(?<![A-Za-z0-9]){re.escape(w)}(?![A-Za-z0-9])" for w in rule.words),
                       re.I if rule.ignore_case else 0)
    return [f"{line}: {text}" for line, text in code_names(source)
            if text == folder or text.startswith(folder + ".") or words.search(text)]


def outside(folder: str) -> dict[str, Path]:
    """Every package module outside ``engines/<folder>/``."""
    own = PKG / "engines" / folder
    return {str(p.relative_to(REPO)): p for p in sorted(PKG.rglob("*.py")) if own not in p.parents}


@pytest.mark.parametrize("rule", RULES, ids=[r.folder for r in RULES])
def test_no_module_outside_an_engines_folder_names_it(rule: Rule) -> None:
    found = [f"{name}:{leak}" for name, p in outside(rule.folder).items() for leak in leaks(rule, p.read_text())]
    assert not found, f"the {rule.folder} engine is named outside its folder:\n" + "\n".join(found)


def test_every_engine_folder_has_a_rule() -> None:
    folders = {p.parent.name for p in (PKG / "engines").glob("*/__init__.py")}
    assert folders <= {r.folder for r in RULES}, folders


VLLM, LLAMA, CB, TF = RULES


@pytest.mark.parametrize(("rule", "snippet"), [
    (VLLM, "from pytest_kvaudit.engines.vllm import cells\n"),
    (VLLM, "import pytest_kvaudit.engines.vllm.backend as b\n"),
    (VLLM, 'NAME = "vllm"\n'),
    (VLLM, 'def f(x):\n    return x == "vllm"\n'),
    (VLLM, 'KEY = f"vllm_{1}"\n'),
    (VLLM, 'ep = "pytest_kvaudit.engines.vllm.record:VLLM"\n'),
    (VLLM, "from vllm import LLM\n"),
    (LLAMA, 'if backend == "llama.cpp":\n    pass\n'),
    (LLAMA, "from pytest_kvaudit.engines.llama_cpp.backend import KV_TYPES\n"),
    (CB, 'spec = engine("transformers-cb")\n'),
    (TF, "from pytest_kvaudit.engines.transformers.backend import open_spec\n"),
    (TF, "x = TransformersBackend.of_model(m)\n"),
])
def test_a_planted_name_is_found(rule: Rule, snippet: str) -> None:
    assert leaks(rule, snippet), snippet


@pytest.mark.parametrize(("rule", "snippet"), [
    (VLLM, '"""The vLLM engine\'s cells (vllm)."""\n'),
    (VLLM, 'raise ValueError("the vllm backend runs quantized:fp8 only")\n'),
    (VLLM, "def f():\n    \"\"\"vllm's docstring\"\"\"\n"),
    (TF, "import transformers\nfrom transformers import AutoModel\n"),
    (TF, 'backend = "transformers"\n'),
])
def test_docstrings_messages_and_the_library_are_not_names(rule: Rule, snippet: str) -> None:
    assert not leaks(rule, snippet), snippet
