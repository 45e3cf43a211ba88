"""Small HTML helpers shared by the page builder and the claims' own sections (no claim knowledge here)."""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Sequence
from typing import Any


def e(x: Any) -> str:
    return html.escape(str(x))


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
