"""The pipeline is declared once: a schedule a user registers runs in every cell, is priced by the plan
exactly as it ran, joins the report's construction axes and the ledger, plain and under ``-n 2``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtest import run, setup_suite
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import cell_steps, constructions, step_named
from pytest_kvaudit.core.model.schedules import extra_constructions, register_schedule, schedule, unregister_schedule

HALVES = '''
from pytest_kvaudit.core.model.schedules import register_schedule

@register_schedule("halves")
def halves(prompt_len, length, arg=None):
    return [length - length // 2, length // 2] if length > 1 else [length]
'''


@pytest.fixture
def halves() -> object:
    @register_schedule("halves")
    def fn(prompt_len: int, length: int, arg: int | None = None) -> list[int]:
        return [length - length // 2, length // 2] if length > 1 else [length]

    yield fn
    unregister_schedule("halves")


def test_a_registered_schedule_is_a_step_of_every_cell(halves: object) -> None:
    cfg = AuditConfig(chunks=(4,))
    names = [s.name for s in constructions(cfg)]
    assert names == ["prefill", "prefill:replica", "incremental", "halves", "chunked(4)"]
    assert [s.name for s in cell_steps(cfg)][:2] == ["live", "live:replica"]
    assert extra_constructions() == ("halves",)
    step = step_named("halves")
    assert step.group == "constructions" and schedule(step.schedule, 3, 9) == [5, 4]
    # priced from its own schedule: two calls for the state, one a suffix token
    assert step.price(3, 9, 6) == (2 + 6, 9 + 6)
    assert "halves" in cfg.work_identity()["constructions"]


def test_builtin_schedules_are_not_extra_constructions() -> None:
    assert extra_constructions() == ()
    with pytest.raises(Exception, match="schedule name"):
        register_schedule("chunked(3)")


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_registered_schedule_runs_and_is_priced(pytester: pytest.Pytester, tiny_llama: Path, workers: str) -> None:
    setup_suite(pytester, conftest=HALVES)
    res, data = run(pytester, tiny_llama, "-n", workers, "-k", "replica or matched")
    assert res.ret == 0, res.stdout.str()[-3000:]
    axes = {(a["dtype"], a["construction"]) for a in data["analyses"]["axes"]}
    assert ("bf16", "halves") in axes and ("fp32", "halves") in axes
    plan = data["plan"]
    # the plan's model prices the run's own lengths, the new schedule included, token for token
    assert plan["priced_after_run"]["forward_tokens"] == data["cost"]["forward_tokens"]
    assert "halves" in plan["steps"]["bf16"] and plan["steps"]["bf16"]["halves"]["cells"] == plan["items"]


def test_the_plan_prices_a_registered_schedule(pytester: pytest.Pytester, tiny_llama: Path) -> None:
    setup_suite(pytester, conftest=HALVES)
    plain, _ = run(pytester, tiny_llama, "--kvaudit-plan")
    assert plain.ret == 0
    plain.stdout.fnmatch_lines(["*halves*"])
    report = json.loads((pytester.path / "report.json").read_text())
    assert report["plan"]["steps"]["fp32"]["halves"]["forward_tokens"] > 0
