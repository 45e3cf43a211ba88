"""The architecture holds: the core never imports pytest, imports flow one way between the layers, no
module imports in a circle, modules and classes stay small, and a built-in claim's name lives only in its
own module and the registry."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from kvtest import REPO

PKG = REPO / "pytest_kvaudit"
_CORE = ("core", "core.model", "core.itemsets", "core.cost", "core.runtime", "core.compute", "core.gate",
         "core.planning", "core.requests", "core.engine")
#: each layer and the layers it may import (the pytest side, at the top, may import all of them). The core, from
#: the bottom: errors and atomic writes; plain data; the built-in item sets; arithmetic on lengths; torch and the
#: engines; the computation; a request-level engine's shared cells (over the computation); the baseline gate's
#: logic; the plan; an engine's record (its parts' defaults are the
#: forward-level computation and calibration). Over the core: the workers and the claims; the
#: reports, which render the claims, over those
LAYERS = {
    "core": {"core"},
    "core.model": {"core", "core.model"},
    "core.itemsets": {"core", "core.model", "core.itemsets"},
    "core.cost": {"core", "core.model", "core.cost"},
    "core.runtime": {"core", "core.model", "core.itemsets", "core.runtime"},
    "core.compute": {"core", "core.model", "core.itemsets", "core.cost", "core.runtime", "core.compute"},
    "core.gate": {"core", "core.model", "core.itemsets", "core.cost", "core.runtime", "core.gate"},
    "core.requests": {"core", "core.model", "core.itemsets", "core.cost", "core.runtime", "core.compute",
                      "core.requests"},
    "core.planning": set(_CORE) - {"core.engine", "core.requests"},
    "core.engine": set(_CORE),
    "workers": {"workers", *_CORE},
    "claims": {"claims", *_CORE},
    "report": {"report", "claims", *_CORE},
    "engines": {"engines"},
}
#: each engine is one folder (``engines/<name>/``): it may import the core and itself, never another engine, and
#: nothing in the core, the claims, the workers or the reports imports it (only its entry point names it)
ENGINES = sorted(p.parent.name for p in (PKG / "engines").glob("*/__init__.py"))
LAYERS.update({f"engines.{e}": {"engines", f"engines.{e}", *_CORE} for e in ENGINES})
#: the most import floors within one layer: a module that imports nothing of its layer is floor 1
MAX_FLOORS = 6
BUILTIN_CLAIMS = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "ledger_audit",
                  "donor_following", "lossy_cache_budget", "prefix_cache")


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


#: a string that names a package module the way ``import_module`` or an entry point does ("pkg.mod" or
#: "pkg.mod:attr"), or the start of one built in an f-string ("pkg.report.{name}")
MODULE_STRING = re.compile(r"(pytest_kvaudit(?:\.\w+)*)(?::[\w.]+)?")


def named_module(text: str, known: dict[str, Path], partial: bool = False) -> str | None:
    """The package module ``text`` names as a string (the nearest known package for an f-string's start)."""
    m = MODULE_STRING.fullmatch(text.rstrip(".") if partial else text)
    if m is None:
        return None
    mod = m.group(1)
    while mod not in known and "." in mod:
        mod = mod.rsplit(".", 1)[0]
    return mod if mod in known and mod != "pytest_kvaudit" else None


def entry_points() -> dict[str, dict[str, str]]:
    """pyproject's entry-point groups: name -> target, per group."""
    data = tomllib.loads((REPO / "pyproject.toml").read_text())
    return dict(data["project"].get("entry-points", {}))


def imports(path: Path, name: str) -> set[str]:
    """The package modules ``path`` imports, at module level, inside functions or for type checking only: a
    ``TYPE_CHECKING`` import never runs, yet it is a dependency all the same (a module typed against another
    cannot be read, moved or tested without it), so it counts. So does a string that names a module the way
    ``import_module`` takes one ("pytest_kvaudit.core.compute.store:Store"): an import hidden in data."""
    tree = ast.parse(path.read_text())
    known = modules()
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Constant) and isinstance(child.value, str):
                found.add(named_module(child.value, known) or name)
            elif isinstance(child, ast.JoinedStr) and child.values and isinstance(child.values[0], ast.Constant):
                found.add(named_module(str(child.values[0].value), known, partial=True) or name)
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("pytest_kvaudit"))
            elif isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("pytest_kvaudit"):
                for a in child.names:  # "from pkg import module" imports the module
                    sub = f"{child.module}.{a.name}"
                    found.add(sub if sub in known else child.module)
            visit(child)

    visit(tree)
    found.discard(name)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    """Every module's imports; the entry points' targets count as imports of the pytest side's plugin, which is
    what loads them (pytest its ``pytest11`` plugins, the run its ``kvaudit.engines`` engines)."""
    g = {name: imports(path, name) for name, path in modules().items()}
    known = modules()
    for targets in entry_points().values():
        g["pytest_kvaudit.plugin"].update(m for t in targets.values() if (m := named_module(t, known)))
    g["pytest_kvaudit.plugin"].discard("pytest_kvaudit.plugin")  # pytest11 names the plugin itself
    return g


def layer(module: str) -> str:
    parts = module.split(".")[1:]
    if parts[:1] == ["engines"]:
        return "engines." + parts[1] if len(parts) > 1 else "engines"
    if parts[:1] == ["core"]:
        return "core." + parts[1] if len(parts) > 2 or (len(parts) == 2 and f"core.{parts[1]}" in LAYERS) else "core"
    return parts[0] if parts and (len(parts) > 1 or parts[0] in LAYERS) else "pytest side"


def floors(g: dict[str, set[str]], members: set[str]) -> tuple[int, list[str]]:
    """The longest chain of imports among ``members`` (no circle: the test above holds that)."""
    memo: dict[str, list[str]] = {}

    def chain(m: str) -> list[str]:
        if m not in memo:
            memo[m] = max(([m, *chain(n)] for n in g[m] if n in members), key=len, default=[m])
        return memo[m]

    longest = max((chain(m) for m in members), key=len, default=[])
    return len(longest), longest


def test_the_core_never_imports_pytest() -> None:
    code = ("import sys\nimport pytest_kvaudit.core.compute.store, pytest_kvaudit.core.planning.plan, "
            "pytest_kvaudit.core.cost.ledger, pytest_kvaudit.core.compute.probes, pytest_kvaudit.core.gate.identity, "
            "pytest_kvaudit.core.itemsets.builtin_items, pytest_kvaudit.workers.merge, pytest_kvaudit.workers.queue, "
            "pytest_kvaudit.claims, pytest_kvaudit.report.document, pytest_kvaudit.report.terminal\n"
            "bad = [m for m in ('pytest', '_pytest', 'pluggy') if m in sys.modules]\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_no_package_module_imports_in_a_circle() -> None:
    g = graph()
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(g[m]):
            if state.get(n) == 1:
                cycle = stack[stack.index(n):] + [n]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if n not in state:
                dfs(n)
        stack.pop()
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            dfs(m)


def test_imports_flow_one_way_between_the_layers() -> None:
    wrong = []
    for m, deps in graph().items():
        own = layer(m)
        if own not in LAYERS:
            continue
        wrong += [f"{m} -> {d}" for d in sorted(deps) if layer(d) not in LAYERS[own] and d != "pytest_kvaudit"]
    assert not wrong, "imports against the layers' direction:\n" + "\n".join(wrong)


def test_no_layer_stacks_more_than_six_floors() -> None:
    """A layer whose modules import each other 16 deep cannot be read from the bottom up: each layer stays
    within :data:`MAX_FLOORS` floors (the layers themselves stack one way, the test above)."""
    g = graph()
    deep = []
    for name in LAYERS:
        n, longest = floors(g, {m for m in g if layer(m) == name})
        if n > MAX_FLOORS:
            deep.append(f"{name}: {n} floors: " + " -> ".join(longest))
    assert not deep, "\n".join(deep)


def test_modules_and_classes_stay_small() -> None:
    big = []
    for name, p in modules().items():
        text = p.read_text()
        lines = text.count("\n")
        if lines > 300:
            big.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 150:
                big.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not big, "\n".join(big)


def code_words(path: Path) -> str:
    """The module's code without its comments and docstrings: identifiers, imports and string constants."""
    tree = ast.parse(path.read_text())
    docs = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docs.add(id(first.value))
    words = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            words.append(node.value)
        elif isinstance(node, ast.Name):
            words.append(node.id)
        elif isinstance(node, ast.Attribute):
            words.append(node.attr)
        elif isinstance(node, ast.ImportFrom):
            words += [node.module or "", *(a.name for a in node.names)]
        elif isinstance(node, ast.Import):
            words += [a.name for a in node.names]
    return "\n".join(words)


def test_a_claims_name_lives_in_its_own_module_and_the_registry() -> None:
    leaks = []
    for name, p in modules().items():
        if name in ("pytest_kvaudit.claims",):  # the registry: importing the modules registers them
            continue
        words = code_words(p)
        # a whole word: vLLM's reset_prefix_cache() is the engine's name, not the prefix_cache claim's
        leaks += [f"{name} spells {c}" for c in BUILTIN_CLAIMS
                  if re.search(rf"\b{c}\b", words) and name != f"pytest_kvaudit.claims.{c}"]
    assert not leaks, "\n".join(leaks)


def test_package_imports_sit_at_module_level() -> None:
    """An import inside a function hides a dependency from the reader and from this file's circle check's
    intent; the few left must say why (today: the ledger's syrupy extension, which imports pytest)."""
    inside = []
    for name, p in modules().items():
        for f in ast.walk(ast.parse(p.read_text())):
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside += [f"{name}:{n.lineno}" for n in ast.walk(f) if isinstance(n, ast.ImportFrom)
                           and (n.module or "").startswith("pytest_kvaudit")]
    assert len(set(inside)) <= 20, "\n".join(sorted(set(inside)))


def test_ruff_reads_every_package_file() -> None:
    """Ruff's default excludes skip folders named like build outputs (``dist``, ``build``): none may hold code."""
    ruff = pytest.importorskip("ruff")  # the dev extra; its binary sits beside the module
    from ruff.__main__ import find_ruff_bin

    out = subprocess.run([find_ruff_bin(), "check", "--show-files", str(PKG)], capture_output=True, text=True,
                         cwd=REPO, check=False).stdout
    read = {Path(line.strip()).resolve() for line in out.splitlines() if line.strip().endswith(".py")}
    missing = sorted(str(p.relative_to(REPO)) for p in PKG.rglob("*.py") if p.resolve() not in read)
    assert ruff and not missing, missing


def test_strings_that_name_modules_count_as_imports(tmp_path: Path) -> None:
    """A "module:attr" string, an f-string's start and an entry point's target are imports the layers see."""
    f = tmp_path / "m.py"
    f.write_text('A = "pytest_kvaudit.core.compute.store:Store"\nB = f"pytest_kvaudit.report.{A}"\n'
                 'C = "pytest_kvaudit is a name, not pytest_kvaudit.core.compute.cells"\n')
    assert imports(f, "x") == {"pytest_kvaudit.core.compute.store", "pytest_kvaudit.report"}
    targets = {t for group in entry_points().values() for t in group.values()}
    assert targets and all(named_module(t, modules()) for t in targets), targets
    assert "pytest_kvaudit.engines.vllm.record" in graph()["pytest_kvaudit.plugin"]


def test_the_model_layer_names_no_higher_layer_in_a_string() -> None:
    """``core.model`` is data: it holds the engine registry, not the engines' module paths (they are entry
    points, declared in pyproject.toml)."""
    known = modules()
    words = {name: code_words(p) for name, p in known.items() if layer(name) == "core.model"}
    leaks = [f"{name}: {w}" for name, text in words.items() for w in text.splitlines()
             if (m := named_module(w, known)) and layer(m) not in LAYERS["core.model"]]
    assert not leaks, "\n".join(leaks)


def test_floors_count_the_longest_chain_within_a_layer() -> None:
    g = {"a": {"b", "x"}, "b": {"c"}, "c": set(), "x": set()}
    assert floors(g, {"a", "b", "c"}) == (3, ["a", "b", "c"])
    assert floors(g, {"a", "x"})[0] == 2
