"""The estimate a ``--kvaudit-plan`` run leaves in pytest's cache for the run that follows it, keyed on the
run's settings, so the run's end can print estimate against actual."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.planning.plan import at_workers

#: pytest's cache key under which --kvaudit-plan leaves its estimate for the run that follows it
CACHE_KEY = "kvaudit/plan"


def run_key(cfg: AuditConfig) -> str:
    """Which run a plan priced: the checkpoint and every setting that decides the work."""
    model = str(Path(cfg.model).resolve()) if Path(cfg.model).exists() else cfg.model
    return json.dumps([model, cfg.work_identity()], sort_keys=True, default=list)


def remember(cache: Any, cfg: AuditConfig, plan: Mapping[str, Any]) -> None:
    """Leave the plan's estimate in pytest's ``cache`` (None with ``-p no:cacheprovider``: nothing kept)."""
    if cache is not None:
        cache.set(CACHE_KEY, {"key": run_key(cfg), "made": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              **{k: plan.get(k) for k in ("seconds_parts", "workers", "forward_tokens_predicted")}})


def recall(cache: Any, cfg: AuditConfig, workers: int) -> dict[str, Any]:
    """The estimate a --kvaudit-plan run left for this same run, for ``workers`` workers ({} when none, or
    for another run)."""
    got = cache.get(CACHE_KEY, None) if cache is not None else None
    if not isinstance(got, dict) or got.get("key") != run_key(cfg) or not got.get("seconds_parts"):
        return {}
    return {"made": got.get("made"), "planned_workers": got.get("workers"), "workers": workers,
            "seconds_expected": at_workers(got["seconds_parts"], workers),
            "forward_tokens_predicted": got.get("forward_tokens_predicted")}
