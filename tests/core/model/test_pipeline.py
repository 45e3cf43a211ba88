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


def test_a_request_level_record_is_priced_by_what_its_engine_counted() -> None:
    """vLLM's steps are requests: a batch's others, the whole-block and cross-request hits (and the request
    that writes the latter's blocks), a transplant that prefills again. Its records carry each request's
    counted cost; the run's price, a construction's and a group's are those, owned by the step that sent them."""
    from pytest_kvaudit.core.cost.pricing import price
    from pytest_kvaudit.core.model.pipeline import construction_tokens, group_tokens, request_owner
    from pytest_kvaudit.core.model.records import CellRecord, Continuation
    from pytest_kvaudit.engines.vllm.record import request_price

    rec = CellRecord("x", "bf16", (1,) * 40, (2,) * 20, 10, None, "3")
    for name in ("live", "prefill", "warm", "batched(4)"):
        rec.constructions[name] = Continuation((5,) * 4, "fp", "fp", "3", True)
    costs = {"live": (20, 59), "prefill": (5, 53), "warm": (5, 21), "warm:block": (5, 13), "cross:writer": (1, 33),
             "cross": (5, 21), "batched(4)": (25, 53 + 4 * 64), "transplant:live_to_prefill": (5, 53),
             "transplant:sham:live": (5, 53), "transplant:identical:live_to_prefill": (5, 53)}
    rec.requests = {k: {"cost": list(v)} for k, v in costs.items()}
    assert price([rec]) == {"forward_tokens": sum(t for _, t in costs.values()),
                            "forward_calls_cells": sum(c for c, _ in costs.values())}
    assert construction_tokens(rec, "warm") == 21 + 13 + 33 + 21 and construction_tokens(rec, "cross") == 0
    assert construction_tokens(rec, "batched(4)") == 53 + 4 * 64 and group_tokens(rec, "trajectory") == 59
    assert group_tokens(rec, "transplants") == 53 and group_tokens(rec, "controls") == 106
    assert request_owner("prefill:faulted") == ("constructions", "prefill")
    # the plan's model of the same requests: the batch's others decode to the budget; a transplant prefills
    assert request_price("batched(4)", 40, 49, 4, 10) == (1 + 4 + 4 * 11, 49 + 4 + 4 * (49 + 10))
    assert request_price("transplant", 40, 49, 4, 10) == (5, 53) and request_price("prefill", 40, 49, 4, 10) is None
    # a vLLM ledger's units priced on its model: cross is in warm's price, each transplant prefills again
    from pytest_kvaudit.core.cost.pricing import Unit, price_units

    u = Unit(40, 14, head=49, continuations=(("warm", 4), ("cross", 4)), transplant_tokens=8, transplants=2)
    acc = price_units([u], request_price, max_new=20)
    assert acc["cross"][2] == 0 and acc["warm"][2] == request_price("warm", 40, 49, 4, 10)[1]
    assert acc["transplants"][2] == 8 + 2 * 49


def test_the_plan_prices_requests_on_the_blocks_the_run_gives_the_engine() -> None:
    """``--kvaudit-engine-arg block_size=N`` (vLLM) and ``page_size=N`` (transformers-cb) decide which ids a hit
    shares, so the plan prices the requests on those blocks, not on the engine's default ones."""
    from pytest_kvaudit.core.requests.arithmetic import request_price as on_blocks
    from pytest_kvaudit.engines.transformers_cb.record import CONTINUOUS_BATCHING, PAGE
    from pytest_kvaudit.engines.vllm.record import BLOCK, VLLM

    for spec, key, default in ((VLLM, "block_size", BLOCK), (CONTINUOUS_BATCHING, "page_size", PAGE)):
        assert spec.price_under(())("warm", 40, 57, 4, 10) == on_blocks("warm", 40, 57, 4, 10, default)
        small = spec.price_under(((key, "4"),))("warm", 40, 57, 4, 10)
        assert small == on_blocks("warm", 40, 57, 4, 10, 4) != on_blocks("warm", 40, 57, 4, 10, default), spec.name
