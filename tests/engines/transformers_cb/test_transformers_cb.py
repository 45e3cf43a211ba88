"""transformers' continuous batching (``--kvaudit-backend=transformers-cb``) on the embedded checkpoint, this CPU.

What it pins: every hit is proven by the match transformers' cache found for the request (``search_prefix_match``,
the number its ``ContinuousBatchingLogger`` logs), and a request with none is no hit; a cell builds the three hit
shapes (partial at the item's own boundary, whole-block at the nearest page edge, cross-request on pages another
request wrote) and cold constructions that matched nothing; a write into pages is read back; bad settings are one
line before anything is computed; the manager's loop (not a daemon thread) is stopped on every way out. The
module's engine runs with pages of 4, so an 11-id prompt spans two whole pages and a partial one.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import EMBEDDED_DIR
from pytest_kvaudit.engines.transformers_cb import settings

PAGE = 4
IDS = [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # two whole pages of 4 and three ids of a third


def _open(dtype: str, **args: str) -> Any:
    from pytest_kvaudit.engines.transformers_cb.backend import open_backend

    return open_backend(str(EMBEDDED_DIR), dtype, {"page_size": str(PAGE), **args})


@pytest.fixture(scope="module")
def backend() -> Any:
    be = _open("fp32")
    yield be
    be.close()


@pytest.fixture
def builder(backend: Any) -> Any:
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.core.runtime.decoder import Decoder
    from pytest_kvaudit.core.runtime.itemcheck import resolve

    cfg, items = resolve(AuditConfig(backend=settings.NAME, n=2, dtypes=("fp32",)))
    return cfg.engine.cell_builder(Decoder(backend), backend.tokenizer, cfg, items, None,
                                   backend.max_positions), items


def _logged(caplog: pytest.LogCaptureFixture) -> dict[str, int]:
    """What transformers logged: request -> tokens of its prefix match."""
    out = {}
    for r in caplog.records:
        msg = r.getMessage()
        if msg.startswith("Found a prefix match of "):
            n, rid = msg[len("Found a prefix match of "):].split(" tokens for request ")
            out[rid] = int(n)
    return out


def test_every_hit_is_the_match_the_cache_found(backend: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="ContinuousBatchingLogger")
    backend.reset()
    (live,) = backend.run([(IDS, 6, ())])
    assert live.cached == 0 and len(live.tokens) == 6
    # partial: the whole pages reused, the tail (and always the last id) computed again
    (part,) = backend.run([(IDS + list(live.tokens[:3]), 3, ())])
    assert part.cached == 12
    # whole-block: prefix[:-1] fills whole pages, so all of it is reused and only the last id computed
    (whole,) = backend.run([(IDS + list(live.tokens[:2]), 4, ())])
    assert whole.cached == 12 and whole.tokens == live.tokens[2:]
    assert whole.rows == live.rows[2:]  # FP32, one request at a time: the same logits, bit for bit
    # cross-request: pages another request wrote (a prompt sharing the first two pages only)
    backend.reset()
    backend.run([(IDS[:8] + [15], 2, ())])
    (cross,) = backend.run([(IDS, 2, ())])
    assert cross.cached == 8
    backend.reset()
    (cold,) = backend.run([(IDS, 2, ())])
    assert cold.cached == 0
    logged = _logged(caplog)
    rids = sorted(logged, key=lambda r: int(r.split("-")[-1]))
    assert [logged[r] for r in rids] == [12, 12, 8], logged  # the proof is the engine's own number
    assert len(rids) == 3  # neither live, the writer nor cold matched anything


def test_a_request_that_ends_in_its_prefill_shares_no_page(backend: Any) -> None:
    """transformers registers a page for sharing after the step that filled it only while the request runs: a
    prompt-only request (one new token) leaves nothing to hit; the cross-request writer decodes two."""
    backend.reset()
    backend.run([(IDS, 1, ())])
    (again,) = backend.run([(IDS, 1, ())])
    assert again.cached == 0


def test_a_cell_proves_its_hits_and_its_cold_requests(builder: Any) -> None:
    b, items = builder
    rec, prefix = b.compute(items.items[0], "fp32", None, lambda: (True, False))
    assert rec.eligible and prefix is not None
    h = len(prefix) - 1
    warm = rec.constructions["warm"]
    assert warm.reused == h // PAGE * PAGE == rec.requests["warm"]["num_cached_tokens"] > 0
    whole = rec.requests["warm:block"]
    assert whole["num_cached_tokens"] == len(rec.prompt_ids) + whole["boundary"] - 1
    assert whole["blocks_equal"] and whole["suffix_equal"] and whole["logits_equal"]
    cross = rec.constructions["cross"]
    assert cross.reused == rec.requests["cross"]["num_cached_tokens"] == (h - 1) // PAGE * PAGE > 0
    assert rec.requests["cross:writer"]["num_cached_tokens"] == 0
    for name in ("prefill", "prefill:replica", "incremental", "batched(4)"):
        assert rec.requests[name]["num_cached_tokens"] == 0, name
    assert rec.requests["batched(4)"]["prefill_batch"] == 5
    assert rec.constructions["incremental"].same_as(rec.constructions["live"]) and not rec.bridge_mismatch


def test_a_write_is_read_back(backend: Any) -> None:
    import torch

    backend.reset()
    (live,) = backend.run([(IDS, 4, ())])
    n = len(IDS) + 2  # three whole pages and one cell of a fourth: the rest of that page must not move
    before = backend.read(live.blocks, 4 * PAGE)
    state = backend.read(live.blocks, n)
    for t in state.layers:
        t.mul_(-3.0).add_(0.5)
    backend.write(live.blocks, state)
    got = backend.read(live.blocks, 4 * PAGE)
    for layer, (b, g, s) in enumerate(zip(before.layers, got.layers, state.layers)):
        assert torch.equal(g[:, :, :n], s), layer
        assert torch.equal(g[:, :, n:], b[:, :, n:]), layer


@pytest.mark.parametrize("arg, said", [
    ("page_size=abc", "page_size=abc: transformers-cb takes a whole number of tokens per page, at least 4"),
    ("page_size=2", "page_size=2: transformers-cb takes a whole number of tokens per page, at least 4"),
    ("num_blocks=0", "num_blocks=0: transformers-cb takes a whole number of blocks, at least 1"),
    ("max_batch_tokens=1.5", "max_batch_tokens=1.5: transformers-cb takes a whole number of tokens"),
    ("allow_block_sharing=maybe", "allow_block_sharing=maybe: transformers-cb takes true or false"),
    ("safety_margin=1", "safety_margin=1: transformers-cb takes a fraction in [0, 1)"),
    ("block_size=16", "block_size=...: transformers-cb takes allow_block_sharing, max_batch_tokens, num_blocks, "
                      "page_size, safety_margin"),
])
def test_a_bad_setting_is_one_line(arg: str, said: str) -> None:
    key, value = arg.split("=")
    with pytest.raises(KvauditError) as exc:
        settings.parse({key: value})
    assert said in str(exc.value) and "\n" not in str(exc.value)


def test_a_cache_too_small_for_the_items_is_one_line(backend: Any) -> None:
    from dataclasses import replace

    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.core.runtime.itemcheck import resolve
    from pytest_kvaudit.engines.transformers_cb.cells import check_capacity

    cfg, items = resolve(AuditConfig(backend=settings.NAME, n=2))
    check_capacity(backend, cfg, items, backend.tokenizer)  # the module's engine holds them
    small = type("B", (), {"settings": replace(backend.settings, num_blocks=8)})()
    with pytest.raises(KvauditError, match=r"num_blocks=8: transformers-cb needs \d+ pages of 4 free .* give "
                                           r"num_blocks=\d+ or more"):
        check_capacity(small, cfg, items, backend.tokenizer)


def test_an_old_transformers_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    monkeypatch.setattr(transformers, "__version__", "4.57.1")
    with pytest.raises(KvauditError, match=r"reads transformers' continuous batching as of 5.25 \(installed: "
                                           r"4.57.1\); pip install 'transformers>=5.25,<6'"):
        settings.check_version()


def test_a_moved_internal_is_one_line(backend: Any) -> None:
    with pytest.raises(KvauditError, match=r"has no PagedAttentionCache.gone \(reading cache.gone\): the "
                                           r"transformers-cb backend reads .* as of transformers==5.25.0"):
        settings.internal(backend, "cache.gone")


def test_the_loop_is_stopped_on_every_way_out(tmp_path: Any) -> None:
    """The manager's loop is not a daemon thread: a process that fails after opening the engine still exits."""
    code = textwrap.dedent(f"""
        from pytest_kvaudit.engines.transformers_cb.backend import open_backend
        be = open_backend({str(EMBEDDED_DIR)!r}, "fp32", {{"page_size": "4"}})
        assert be.manager.is_running()
        raise SystemExit("failed on purpose")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "failed on purpose" in res.stderr, res.stderr[-2000:]
    be = _open("fp32")
    thread = be.manager._generation_thread
    be.close()
    assert not thread.is_alive() and be.manager is None


# -- the read checked against an outside oracle: transformers' own forward of the same ids ----------------------
def _read(be: Any) -> list[tuple[Any, Any]]:
    """The engine's K/V of ``IDS[:-1]`` (two whole pages and a partial one), as the audit reads them."""
    be.reset()
    (d,) = be.run([(IDS, 2, ())])
    state = be.read(d.blocks, len(IDS) - 1)
    return [state.kv(i) for i in range(len(state.layers))]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_read_is_transformers_own_forward(backend: Any, dtype: str) -> None:
    from pytest_kvaudit.oracle import FP32_RTOL, check_read, reference_kv

    be = backend if dtype == "fp32" else _open(dtype)
    try:
        check = check_read(_read(be), reference_kv(be.model, IDS[:-1]))
    finally:
        if be is not backend:
            be.close()
    # FP32: within the tolerance; both: each position nearest its own (a repeated token's V is a tie, not a miss)
    check.assert_ok(FP32_RTOL if dtype == "fp32" else None)
    assert check.positions == len(IDS) - 1 == 2 * PAGE + 2


def test_a_read_permuted_inside_a_page_fails_the_oracle(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layout bug the oracle is for: every value read, each at another position inside its page."""
    import torch

    from pytest_kvaudit.engines.transformers_cb.loop import Hooks
    from pytest_kvaudit.oracle import FP32_RTOL, check_read, permute_in_blocks, reference_kv

    read_pages = Hooks.read_pages

    def permuted(self: Hooks, blocks: Any) -> list[Any]:
        idx = torch.tensor(permute_in_blocks(len(blocks) * self.page, self.page))
        return [t[:, :, idx] for t in read_pages(self, blocks)]

    monkeypatch.setattr(Hooks, "read_pages", permuted)
    check = check_read(_read(backend), reference_kv(backend.model, IDS[:-1]))
    assert check.misplaced > 0
    with pytest.raises(AssertionError, match="rows nearest another position"):
        check.assert_ok(FP32_RTOL)


# -- whole runs of the built-in claims ------------------------------------------------------------------------------
#: what transformers-cb can judge (the layer sweep, the batch-invariance probe and the attention axes it cannot run)
CLAIMS = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "prefix_cache",
          "donor_following", "ledger_audit")
#: past the first page of 16: the embedded set's own boundary (``;``) lies inside it
BOUNDARY = "tokens:30"


def _run(pytester: pytest.Pytester, conftest: str, *args: str) -> tuple[Any, dict[str, Any]]:
    import json
    import shutil

    from kvtest import LOW_BARS, REPO

    for f in (REPO / "suites").glob("test_*.py"):
        shutil.copy(f, pytester.path / f.name)
    pytester.makeini(LOW_BARS)
    if conftest:
        pytester.makeconftest(conftest)
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-backend={settings.NAME}", f"--kvaudit-report={report}",
                                        "-p", "no:cacheprovider", "-W", "ignore", f"--kvaudit-boundary={BOUNDARY}",
                                        *args)
    return res, (json.loads(report.read_text()) if report.exists() else {})


def test_an_audit_of_the_embedded_checkpoint_judges_every_claim(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    res, data = _run(pytester, "", "--kvaudit-n=6", "--kvaudit-dtypes=bf16,fp32")
    out = res.stdout.str()
    assert sorted(data["claims"]) == sorted(CLAIMS), out[-3000:]
    assert all(c["status"] in ("pass", "fail", "inconclusive") for c in data["claims"].values())
    assert data["environment"]["backend"] == settings.NAME
    assert data["environment"]["transformers_cb_settings"]["page_size"] == 16
    assert data["claims"]["bridge_bitexact"]["status"] == "pass", data["claims"]["bridge_bitexact"]["reason"]
    assert data["claims"]["replica_exactness"]["status"] == "pass"
    pc = data["claims"]["prefix_cache"]
    assert pc["status"] == "pass" and pc["n"] == pc["k"] > 0, pc["reason"]
    for dtype in ("bf16", "fp32"):  # every hit shape, proven on every unit
        shapes = pc["figures"]["per_dtype"][dtype]
        assert shapes["whole_block"]["n"] == 6 and shapes["whole_block"]["no_hit"] == 0, shapes
        assert shapes["partial"]["n"] == 6 and shapes["partial"]["no_hit"] == 0, shapes
        assert shapes["cross_request"]["n"] == 6 and shapes["cross_request"]["no_hit"] == 0, shapes
    m = data["claims"]["matched_construction"]["figures"]["divergent_suffixes"]
    assert m["fp32"] == 0, m  # BF16's count is this CPU's; FP32 must hold everywhere
    cost, plan = data["cost"], data["plan"]
    assert plan["priced_after_run"]["forward_tokens"] == cost["forward_tokens"], (plan["priced_after_run"], cost)


#: prefill's last layer perturbed (its pages, then continued warm): the divergent units donor following needs
DIVERGE = ("from pytest_kvaudit.core.runtime.decoder import Faults\n\n"
           "def diverge(state, path):\n    if path == 'prefill':\n        state.layers[-1].mul_(-2.0)\n\n")


@pytest.mark.parametrize("copies", [True, False], ids=["transplant", "copies-nothing"])
def test_donor_following_judges_transplants_into_pages(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                       copies: bool) -> None:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    transplant = "" if copies else ", transplant=nothing"
    res, data = _run(pytester, DIVERGE + "def nothing(receiver, donor, layers, parts):\n    return receiver.clone()\n\n"
                               f"def pytest_kvaudit_faults(config):\n    return Faults(state=diverge{transplant})\n",
                     "--kvaudit-n=3", "--kvaudit-dtypes=fp32", "--kvaudit-claims=donor_following")
    d = data["claims"]["donor_following"]
    assert d["n"] > 0 and d["status"] == ("pass" if copies else "fail"), (d, res.stdout.str()[-2000:])
    assert d["figures"]["sham_flips"][1] > 0 and d["figures"]["sham_flips"][0] == 0
