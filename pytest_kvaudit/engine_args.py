"""``--kvaudit-engine-arg KEY=VALUE`` (repeatable; ini twin ``kvaudit_engine_arg``, one pair a line): an engine's own
settings, read at configure time and checked by the engine's record (:attr:`EngineSpec.engine_arg_keys`: which keys
it takes; :attr:`EngineSpec.check_settings`: what their values mean, with the rest of the run's config)."""

from __future__ import annotations

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig, parse_engine_args
from pytest_kvaudit.core.model.engine_protocol import Engine
from pytest_kvaudit.core.model.schedules import extra_constructions
from pytest_kvaudit.options import BACKEND, ENGINE_ARG, ENGINE_ARGS_INI


def engine_args(config: pytest.Config, engine: Engine) -> tuple[tuple[str, str], ...]:
    """``--kvaudit-engine-arg`` pairs (or the ini's lines), each key one that ``engine`` (its record) takes."""
    given = config.getoption("kvaudit_engine_arg")
    source = ENGINE_ARG if given else f"{ENGINE_ARGS_INI} (ini)"
    pairs = parse_engine_args(given or config.getini(ENGINE_ARGS_INI), source)
    return engine.check_engine_args(pairs, source)


def check_run(cfg: AuditConfig) -> AuditConfig:
    """The run's config as its engine checks it, once, before anything computes: a request-level engine runs no
    registered chunk schedule (its constructions are requests, not forwards on a caller's cache), then the
    record's own check of its settings (:attr:`EngineSpec.check_settings`)."""
    if cfg.engine.level == "request" and (extra := extra_constructions()):
        raise KvauditError(f"{BACKEND}={cfg.engine.name} serves requests: the registered schedule(s) "
                           f"{', '.join(extra)} are chunk schedules of forwards, which it cannot run; unregister them "
                           "for this run")
    cfg.engine.check_settings(cfg)
    return cfg
