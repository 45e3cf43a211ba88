"""Progress while the store computes, through pytest's terminal reporter (so it shows under capture)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest


def terminal_progress(config: pytest.Config) -> Callable[[int, int, int, float], None] | None:
    """A callback ``(done, total, tokens, seconds)``: one line rewritten in place on a terminal, a line
    every tenth of the work in a log; None on an xdist worker or without a terminal reporter."""
    tr: Any = config.pluginmanager.get_plugin("terminalreporter")
    cap: Any = config.pluginmanager.get_plugin("capturemanager")
    if tr is None or hasattr(config, "workerinput"):
        return None
    tty = bool(getattr(tr, "isatty", False))
    state = {"shown": 0.0, "decile": 0}

    def show(done: int, total: int, tokens: int, seconds: float) -> None:
        decile = done * 10 // total
        if done < total and ((tty and seconds - state["shown"] < 0.5) or (not tty and decile == state["decile"])):
            return
        state["shown"], state["decile"] = seconds, decile
        rate = tokens / seconds if seconds > 0 else 0.0
        left = seconds / done * (total - done) if done else 0.0
        msg = f"kvaudit: {done}/{total} item x precision cells, {rate:,.0f} tokens/s, ~{left:.0f}s left"
        with cap.global_and_fixture_disabled() if cap is not None else nullcontext():
            if tty:
                tr.rewrite(msg, erase=True)
                if done == total:
                    tr.write_line("")
            else:
                tr.ensure_newline()
                tr.write_line(msg)

    return show
