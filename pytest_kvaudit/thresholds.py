"""Claim thresholds from the ini (``kvaudit_thresholds``, one ``claim.key=value`` a line): parsed and checked
at configure time for the claims known then, at collection for the claims the collected files registered,
and, under ``--kvaudit-strict``, at the end, where a line that no judged claim read fails the gate."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import pytest

from pytest_kvaudit.claims import registered
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig, parse_threshold_value
from pytest_kvaudit.options import STRICT, THRESHOLDS_INI

if TYPE_CHECKING:
    from pytest_kvaudit.session import KvauditSession


def parse_thresholds(lines: list[str]) -> dict[str, dict[str, float]]:
    """``claim.key=number`` lines -> {claim: {key: value}}; the syntax and the numbers are checked here,
    the names by :func:`check_thresholds` against the claims registered so far."""
    out: dict[str, dict[str, float]] = {}
    for line in lines:
        key, sep, val = line.partition("=")
        claim, dot, name = key.strip().partition(".")
        if not sep or not dot or not claim or not name.strip():
            raise pytest.UsageError(f"{THRESHOLDS_INI}: {line!r} is not 'claim.key=number'")
        try:
            out.setdefault(claim, {})[name.strip()] = parse_threshold_value(f"{THRESHOLDS_INI}: {line.strip()!r}", val)
        except KvauditError as exc:
            raise pytest.UsageError(str(exc)) from None
    return out


def check_thresholds(thresholds: Mapping[str, Mapping[str, float]], audit: AuditConfig,
                     claims: Iterable[Any]) -> list[str]:
    """Check the keys of every threshold line whose claim is in ``claims`` (registered ones); return the
    claim names not among them, in order. An unknown key is a one-line usage error naming the known ones."""
    known = {c.name: c for c in claims}
    unknown: list[str] = []
    for name, keys in thresholds.items():
        if name not in known:
            unknown.append(name)
            continue
        have = known[name].defaults(audit)
        bad = [k for k in keys if k not in have]
        if bad:
            raise pytest.UsageError(
                f"{THRESHOLDS_INI}: claim {name} has no threshold {bad[0]!r}; its thresholds are "
                f"{', '.join(sorted(have))}"
            )
    return unknown


def unknown_claims_message(unknown: list[str], claims: Iterable[Any]) -> str:
    return (f"{THRESHOLDS_INI}: no claim named {', '.join(map(repr, unknown))}; known claims: "
            f"{', '.join(sorted(c.name for c in claims))} (a claim of your own must be registered by a collected "
            "test file or a conftest.py)")


def unread_thresholds(thresholds: Mapping[str, Mapping[str, float]], judged: Iterable[str]) -> list[str]:
    """The threshold lines (as ``claim.key=value``) of claims this run never judged: no claim read them."""
    seen = set(judged)
    return [f"{name}.{key}={val:g}" for name, keys in thresholds.items() if name not in seen
            for key, val in keys.items()]


def unread_thresholds_message(lines: list[str], judged: Iterable[str], claims: Iterable[Any]) -> str:
    """Under --kvaudit-strict a threshold nobody read fails the run: a CI gate with a typo would gate nothing."""
    judged = sorted(judged)
    known = sorted({c.name for c in claims} | set(judged))
    return (f"{STRICT}: {THRESHOLDS_INI} line{'s' if len(lines) > 1 else ''} {', '.join(map(repr, lines))} read by no "
            f"claim of this run (judged: {', '.join(judged)}); known claims: {', '.join(known)}")


def at_collection(sess: KvauditSession) -> None:
    """Threshold lines for claims that no collected file registered.

    A user's claim is registered when its test file is imported, so only now are all names known, and
    only for the files this run collected. When the run collected its default tree (testpaths or the
    current folder) every claim of the project is registered: an unknown name is a typo and a usage
    error. When the command line named paths, the claim may live in a file not collected: the line is
    unused, so it is named in the summary rather than refused. On an xdist worker, which cannot stop
    the run with a usage error, it fails every claim test with the same one line.
    """
    lines = sess.settings.thresholds
    if not lines:
        return

    try:
        unknown = check_thresholds(lines, sess.config, registered())
        if not unknown:
            return
        msg = unknown_claims_message(unknown, registered())
        if sess.pytest_config.args_source == pytest.Config.ArgsSource.ARGS:
            sess.verdicts.notes.append(f"{msg}; the line was not used")
            return
        raise pytest.UsageError(msg)
    except pytest.UsageError as exc:
        if not hasattr(sess.pytest_config, "workerinput"):
            raise
        sess.run.error = str(exc)


def gate_unread(session: pytest.Session, sess: KvauditSession) -> None:
    """--kvaudit-strict: a threshold line that no judged claim read fails the run (a typo would gate nothing).
    Only in a run that judged claims: a shard's claims skip by design (its merge is the gate)."""
    said = sess.verdicts
    if not sess.settings.strict or not said.claims or sess.run.topology.shard is not None:
        return
    unread = unread_thresholds(sess.settings.thresholds, said.claims)
    if unread:
        said.strict_line = unread_thresholds_message(unread, said.claims, registered())
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
