"""The docs site's generated parts, and the mkdocs hook that puts them in (``hooks:`` in mkdocs.yml).

Pages hold markers such as ``<!-- kvaudit:options -->``; the hook replaces each one with text built from the
code that declares the thing, so an option, a threshold or a claim added in the code needs no hand edit of the
docs. ``tests/project/test_docs.py`` imports this module: the same functions are what the tests check.

Markers:

- ``<!-- kvaudit:options -->``: every ``--kvaudit-*`` option with its ini twin, default and help, read by
  calling the plugin's own ``pytest_addoption`` on a recording parser;
- ``<!-- kvaudit:ini -->``: the ini keys that have no command-line twin;
- ``<!-- kvaudit:claim NAME -->``: a built-in claim's title, what it reads, least evidence and thresholds,
  from its class (``pytest_kvaudit/claims/NAME.py``);
- ``<!-- kvaudit:readme -->``: README.md up to its list of docs pages, its links made the site's, so the home page
  and the README never say two things.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

MARKER = re.compile(r"<!-- kvaudit:(\w+)(?: ([\w.-]+))? -->")
DEFAULT = re.compile(r"\(default:? ([^()]*(?:\([^()]*\)[^()]*)*)\)")


@dataclass
class Option:
    flags: tuple[str, ...]
    dest: str
    help: str
    is_flag: bool
    ini: str | None = None
    metavar: str | None = None  # as declared; pytest --help shows it after "=", so the page does too
    optional: bool = False  # nargs="?": the value may be left out (--help: "=[VALUE]")

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def usage(self) -> str:
        """The flag as ``pytest --help`` writes it: ``=METAVAR`` (VALUE where none is declared), ``=[VALUE]`` where
        the value may be left out, nothing for a switch."""
        if self.is_flag:
            return self.flag
        value = self.metavar or "VALUE"
        return f"{self.flag}=[{value}]" if self.optional else f"{self.flag}={value}"

    @property
    def default(self) -> str:
        m = DEFAULT.search(self.help)
        if m:
            return m.group(1).split(";")[0].strip()
        return "off" if self.is_flag else "not set"


@dataclass
class Recorder:
    """Stands in for ``pytest.Parser``: records what ``pytest_addoption`` declares, for this page only."""

    options: list[Option] = field(default_factory=list)
    ini: dict[str, str] = field(default_factory=dict)

    def getgroup(self, name: str, description: str = "") -> Recorder:
        return self

    def addoption(self, *flags: str, **attrs: Any) -> None:
        self.options.append(Option(flags, attrs.get("dest") or flags[0].lstrip("-").replace("-", "_"),
                                   str(attrs.get("help", "")), attrs.get("action") == "store_true",
                                   metavar=attrs.get("metavar"), optional=attrs.get("nargs") == "?"))

    def addini(self, name: str, help: str, type: str | None = None, default: Any = None) -> None:
        self.ini[name] = help


def declared() -> Recorder:
    """What the plugin declares, through its own hook (so an option added anywhere in it is seen)."""
    from pytest_kvaudit import plugin

    rec = Recorder()
    plugin.pytest_addoption(rec)  # type: ignore[arg-type]
    for o in rec.options:
        o.ini = o.dest if o.dest in rec.ini else None
    return rec


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;")


def options_markdown(rec: Recorder | None = None) -> str:
    rec = rec or declared()
    rows = ["| option | ini key | default | what it does |", "| --- | --- | --- | --- |"]
    for o in sorted(rec.options, key=lambda o: o.flag):
        ini = f"`{o.ini}`" if o.ini else "-"
        rows.append(f"| `{o.usage}` | {ini} | {_cell(o.default)} | {_cell(o.help)} |")
    return "\n".join(rows) + "\n"


def ini_only_markdown(rec: Recorder | None = None) -> str:
    rec = rec or declared()
    twins = {o.ini for o in rec.options}
    rows = ["| ini key | what it holds |", "| --- | --- |"]
    rows += [f"| `{k}` | {_cell(v)} |" for k, v in sorted(rec.ini.items()) if k not in twins]
    return "\n".join(rows) + "\n"


def claim_markdown(name: str) -> str:
    from pytest_kvaudit.claims import get

    c = get(name)
    analyses = getattr(c, "analyses", ())
    lines = [f"**Title in the report:** {c.title}", "",
             f"**Reads** (`Claim.needs`): {', '.join(f'`{n}`' for n in c.needs) or 'everything'}"
             + (f"; quotes the analyses {', '.join(f'`{a}`' for a in analyses)}" if analyses else ""), "",
             f"**Least evidence:** {c.evidence}.", "",
             "| threshold | default | meaning | counted in |", "| --- | --- | --- | --- |"]
    for key, t in c.thresholds.items():
        lines.append(f"| `{name}.{key}` | {t.default:g} | {_cell(t.meaning)} | {_cell(t.unit or '-')} |")
    return "\n".join(lines) + "\n"


def readme_markdown() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8").split("\n## Documentation", 1)[0]
    return re.sub(r"\]\(docs/([^)]*)\)",
                  lambda m: f"]({m.group(1) + 'index.md' if m.group(1).endswith('/') else m.group(1)})",
                  text) + "\n"


def expand(markdown: str) -> str:
    """Every marker replaced by its generated text; an unknown marker is an error naming it."""

    def one(m: re.Match[str]) -> str:
        kind, arg = m.group(1), m.group(2)
        if kind == "options":
            return options_markdown()
        if kind == "ini":
            return ini_only_markdown()
        if kind == "claim" and arg:
            return claim_markdown(arg)
        if kind == "readme":
            return readme_markdown()
        raise ValueError(f"unknown docs marker {m.group(0)!r}: use kvaudit:options, kvaudit:ini, kvaudit:claim NAME "
                         "or kvaudit:readme")

    return MARKER.sub(one, markdown)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """The mkdocs hook."""
    return expand(markdown)


if __name__ == "__main__":
    print(options_markdown())
    print(ini_only_markdown())
