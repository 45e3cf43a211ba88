"""The counterexamples as HTML: each pair of continuations with the first differing token marked.

A claim's details carry both texts and the suffix position where they part, not the tokens' texts. The
divergence anatomy (live against prefill) records the two tokens there, so for those pairs the mark covers
exactly the first differing token; for any other pair it covers the first differing character to the end of
its word, and the page says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_kvaudit.claims.htmlkit import VISIBLE, e, visible

COLUMNS = 5
#: counterexamples shown open; the rest are folded under a summary line (a BF16 run can give dozens)
SHOWN = 10


def counterexamples(report: Mapping[str, Any], names: Sequence[str]) -> str:
    """The section (empty when no claim gave a counterexample): a row per pair, both texts beneath it."""
    claims = report.get("claims", {})
    ce = [(name, d) for name in names for d in claims[name].get("details") or []]
    if not ce:
        return ""
    tokens = _anatomy_tokens(report)
    rows = []
    for name, d in ce:
        a, b = str(d.get("a")), str(d.get("b"))
        pos = d.get("position")
        known = tokens.get((d.get("item"), d.get("dtype"), pos)) if (a, b) == ("live", "prefill") else None
        ta, tb = marked(str(d.get("text_a") or ""), str(d.get("text_b") or ""), known, pos is not None)
        differs = f" ({e(d['differs'])})" if d.get("differs") else ""
        rows.append(f"<tr><td><code>{e(name)}</code></td><td>{e(d.get('unit'))}</td><td>{e(a)} vs {e(b)}</td>"
                    f"<td>{'equal suffixes' if pos is None else e(pos)}{differs}</td>"
                    f"<td>{_num(d.get('margin_a'))} / {_num(d.get('margin_b'))}</td></tr>"
                    f"<tr class='texts'><td colspan='{COLUMNS}'><div><strong>{e(a)}</strong> <code>{ta}</code></div>"
                    f"<div><strong>{e(b)}</strong> <code>{tb}</code></div></td></tr>")
    head = "".join(f"<th>{h}</th>" for h in ("claim", "unit", "compared", "first differing token (suffix position)",
                                             "top-2 margin there (a / b)"))
    note = ("<p><small>Beneath each pair, both continuations; <mark>marked</mark>: the first token where they part "
            "(the tokens the divergence anatomy recorded) or, where the tokens were not recorded, the first differing "
            "character to the end of its word. Whitespace shows as ␣ (space), ↵ (line break), ⇥ (tab).</small></p>")
    out = f"<table class='counterexamples'><tr>{head}</tr>{''.join(rows[:SHOWN])}</table>"
    if len(rows) > SHOWN:
        out += (f"<details><summary>The other {len(rows) - SHOWN} counterexamples</summary>"
                f"<table class='counterexamples'><tr>{head}</tr>{''.join(rows[SHOWN:])}</table></details>")
    return f"<h2 id='counterexamples'>Counterexamples ({len(ce)})</h2>{note}{out}"


def marked(a: str, b: str, tokens: tuple[str, str] | None, differ: bool = True) -> tuple[str, str]:
    """Both texts as HTML, the first differing token in ``<mark>``: at the latest start at or before the first
    differing character where ``tokens`` (a's, b's) begin both texts; else from that character to its word's end."""
    if not differ:
        return _text(a), _text(b)
    c = len(os.path.commonprefix([a, b]))
    if tokens is not None:
        for s in range(c, -1, -1):
            if a.startswith(tokens[0], s) and b.startswith(tokens[1], s):
                return _mark(a, s, s + len(tokens[0])), _mark(b, s, s + len(tokens[1]))
    return _mark(a, c, _word_end(a, c)), _mark(b, c, _word_end(b, c))


def _word_end(text: str, at: int) -> int:
    m = re.match(r"\s*\S*", text[at:])
    return at + (len(m.group()) if m else 0)


def _mark(text: str, start: int, end: int) -> str:
    tok = text[start:end]
    inside = visible(tok) if tok else "<span class='ws' title='the text ends here'>∅</span>"
    return f"{_text(text[:start])}<mark>{inside}</mark>{_text(text[end:])}"


def _text(s: str) -> str:
    """Escaped text whose line breaks and tabs show (↵, ⇥) and still break the line."""
    out = e(s)
    return out.replace("\n", f"<span class='ws'>{VISIBLE[chr(10)]}</span>\n").replace(
        "\t", f"<span class='ws'>{VISIBLE[chr(9)]}</span>")


def _anatomy_tokens(report: Mapping[str, Any]) -> dict[tuple[Any, Any, Any], tuple[str, str]]:
    """(item, precision, position) -> the live and prefill tokens' texts at the first divergence."""
    rows = ((report.get("analyses") or {}).get("anatomy") or {}).get("divergent") or []
    return {(r.get("item"), r.get("dtype"), r.get("first_divergence")): (r["text_live"], r["text_prefill"])
            for r in rows if r.get("text_live") is not None and r.get("text_prefill") is not None}


def _num(x: Any) -> str:
    return "-" if x is None else f"{x:.4g}"
