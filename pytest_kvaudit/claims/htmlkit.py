"""Small HTML helpers shared by the page builder and the claims' own sections (no claim knowledge here)."""

from __future__ import annotations

import base64
import html
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

#: how whitespace shows where it would otherwise be an empty box: a space, a line break, a tab
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍"}


def e(x: Any) -> str:
    return html.escape(str(x))


def words(x: Any) -> str:
    """A value as a reader says it, not as Python prints it: ``{'boundary_not_reached': 3}`` is
    "boundary not reached 3", ``['bf16', 'fp32']`` is "bf16, fp32", True is "yes", None and {} are "-" and
    "none". Plain text (escape it with :func:`e`)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, Mapping):
        if not x:
            return "none"
        return "; ".join(f"{_key(k)} ({words(v)})" if isinstance(v, (Mapping, list, tuple)) else f"{_key(k)} {words(v)}"
                         for k, v in x.items())
    if isinstance(x, (list, tuple, set, frozenset)):
        return ", ".join(words(v) for v in x) if x else "none"
    return str(x)


def _key(k: Any) -> str:
    return str(k).replace("_", " ")


def breakable(text: str) -> str:
    """Escaped text with line-break chances after separators, so a list such as "1,2,3,…,29" or a long path wraps
    instead of widening its table."""
    return re.sub(r"([,;/=+|_])(?=\S)", r"\1<wbr>", e(text))


def visible(token: Any) -> str:
    """A token's text, escaped, with a whitespace-only token drawn as symbols (␣ ↵ ⇥) rather than an empty box."""
    s = "" if token is None else str(token)
    if s.strip():
        return e(s)
    shown = "".join(VISIBLE.get(c, c) for c in s) or "∅"
    return f"<span class='ws' title='whitespace: {e(repr(s))}'>{e(shown)}</span>"


def table(head: Sequence[str], rows: Sequence[Sequence[Any]], cls: str = "") -> str:
    """A table; header cells are escaped here, body cells are HTML already (escape them with :func:`e`)."""
    h = "".join(f"<th>{e(c)}</th>" for c in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><tr>{h}</tr>{body}</table>'


def status(s: str, upper: bool = False) -> str:
    return f'<span class="{e(s)}">{e(s.upper() if upper else s)}</span>'


def section(anchor: str, title: str, body: str) -> str:
    return f"<h2 id='{e(anchor)}'>{e(title)}</h2>{body}"


def png(fig: Any) -> str:
    """A matplotlib figure as a data URI (the figure is closed)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt
