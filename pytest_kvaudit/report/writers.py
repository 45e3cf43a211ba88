"""The report's formats, one writer per option: ``--kvaudit-report`` (JSON, the schema scripts read) and
``--kvaudit-html`` (tables and figures for people). A new format is one module with a ``write(report, path,
sections)`` function and one entry in :data:`WRITERS`; the option, its ini twin and the call at the session's
end follow from the entry. Every writer writes atomically. The format modules are imported only when their
option is given, so ``pytest --help`` stays fast."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

#: (the run's report, the path asked for, the HTML sections the claims rendered) -> None
WriteFn = Callable[[Mapping[str, Any], Path, Mapping[str, "str | None"]], None]


@dataclass(frozen=True)
class Writer:
    flag: str
    help: str
    #: ``module:function`` under pytest_kvaudit.report, imported when the option is given
    target: str
    #: the claims render their HTML sections for this format (work done only when it is asked for)
    sections: bool = False

    def write(self, report: Mapping[str, Any], path: Path, sections: Mapping[str, str | None]) -> None:
        module, fn = self.target.split(":")
        write: WriteFn = getattr(import_module(f"pytest_kvaudit.report.{module}"), fn)
        write(report, path, sections)


WRITERS = (
    Writer("--kvaudit-report", "write the JSON report to this path", "document:write"),
    Writer("--kvaudit-html", "write the human report (tables and figures) as HTML to this path", "html:write",
           sections=True),
)


def wants_sections(outputs: Mapping[str, Path]) -> bool:
    """A format that shows the claims' own HTML sections is asked for: the claims render them."""
    return any(w.sections and w.flag in outputs for w in WRITERS)


def report_path(outputs: Mapping[str, Path]) -> Path | None:
    """The JSON report's path, when one is asked for."""
    return outputs.get(WRITERS[0].flag)
