"""Bad input and models the audit cannot judge: every case ends in one line naming the option, file or value
and the fix, before any model loads where it can; never a traceback, never a silent wrong run."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_kvaudit import option_values as ov
from pytest_kvaudit import options as opt
from pytest_kvaudit import thresholds
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def one_line(msg: str) -> str:
    assert "\n" not in msg.strip(), msg
    return msg


# -- A. options, checked at configure time (subprocesses: what a user sees) ----------------------------
USAGE_CASES: list[tuple[list[str], str]] = [
    (["--kvaudit-n=0"], "ERROR: --kvaudit-n='0' is out of range: give an integer >= 1*"),
    (["--kvaudit-n=-3"], "ERROR: --kvaudit-n='-3' is out of range*"),
    (["--kvaudit-n=abc"], "ERROR: --kvaudit-n='abc' is not a whole number*"),
    (["--kvaudit-n=1.5"], "ERROR: --kvaudit-n='1.5' is not a whole number*"),
    (["--kvaudit-max-new-tokens=0"], "ERROR: --kvaudit-max-new-tokens='0' is out of range: give an integer >= 1*"),
    (["--kvaudit-max-new-tokens=-1"], "ERROR: --kvaudit-max-new-tokens='-1' is out of range*"),
    (["--kvaudit-threads=0"], "ERROR: --kvaudit-threads='0' is out of range: give an integer from 1 to 4096*"),
    (["--kvaudit-threads=-1"], "ERROR: --kvaudit-threads='-1' is out of range*"),
    (["--kvaudit-threads=99999999999999999999"], "ERROR: --kvaudit-threads=* is out of range*"),
    (["--kvaudit-donor-units=-1"], "ERROR: --kvaudit-donor-units='-1' is out of range: give an integer >= 0*"),
    (["--kvaudit-seed=abc"], "ERROR: --kvaudit-seed='abc' is not a whole number*"),
    (["--kvaudit-seed=-1"], "ERROR: --kvaudit-seed='-1' is out of range: give an integer from 0 to 4294967295*"),
    (["--kvaudit-seed=2.0"], "ERROR: --kvaudit-seed='2.0' is not a whole number*"),
    (["--kvaudit-boundary="], "ERROR: --kvaudit-boundary is empty: give a marker string*"),
    (["--kvaudit-boundary=tokens:-1"], "ERROR: boundary 'tokens:-1': tokens:K needs a whole number K >= 1*"),
    (["--kvaudit-boundary=tokens:0"], "ERROR: boundary 'tokens:0': tokens:K needs a whole number K >= 1*"),
    (["--kvaudit-boundary=tokens:abc"], "ERROR: boundary 'tokens:abc': tokens:K needs*"),
    (["--kvaudit-model="], "ERROR: --kvaudit-model is empty: give a value*or leave the flag out"),
    (["--kvaudit-report=  "], "ERROR: --kvaudit-report is empty*"),
    (["--kvaudit-chunks=0"], "ERROR: --kvaudit-chunks: chunk sizes must be positive*"),
    (["--kvaudit-analyses=sweep"],
     "ERROR: --kvaudit-analyses: unknown analysis 'sweep'; use layer_sweep, batch_invariance or all"),
    (["--kvaudit-backend=vllm", "--kvaudit-engine-arg", "block_size"],
     "ERROR: --kvaudit-engine-arg 'block_size': give KEY=VALUE*"),
    (["--kvaudit-backend=vllm", "--kvaudit-engine-arg", "1x=2"], "ERROR: --kvaudit-engine-arg '1x=2': give KEY=VALUE*"),
    (["--kvaudit-backend=vllm", "--kvaudit-engine-arg=block_size=16", "--kvaudit-engine-arg=block_size=32"],
     "ERROR: --kvaudit-engine-arg: block_size is given twice (block_size=16 and block_size=32); give it once"),
    (["--kvaudit-engine-arg=block_size=16"], "ERROR: --kvaudit-engine-arg block_size: the transformers backend takes "
                                             "no such setting (it takes: none)"),
    # a cache kind the engine does not run, before anything loads (each engine's EngineSpec.cache_kinds)
    (["--kvaudit-backend=llama.cpp", "--kvaudit-cache=dynamic,quantized:fp8"],
     "ERROR: --kvaudit-cache=quantized:fp8: the llama.cpp backend runs no kind beyond dynamic"),
    (["--kvaudit-backend=vllm", "--kvaudit-cache=dynamic,quantized:quanto-int4"],
     "ERROR: --kvaudit-cache=quantized:quanto-int4: the vllm backend runs quantized:fp8 (vLLM's kv_cache_dtype=fp8)"),
    (["--kvaudit-backend=vllm", "--kvaudit-cache=static"],
     "ERROR: --kvaudit-cache=static: the vllm backend runs quantized:fp8 (vLLM's kv_cache_dtype=fp8)"),
]


def usage_error(res: pytest.RunResult, pattern: str) -> None:
    assert res.ret == pytest.ExitCode.USAGE_ERROR, res.stdout.str() + res.stderr.str()
    res.stderr.fnmatch_lines([pattern])
    errors = [line for line in res.stderr.lines if line.startswith("ERROR:")]
    assert len(errors) == 1, res.stderr.str()
    out = res.stdout.str() + res.stderr.str()
    assert "Traceback" not in out


@pytest.mark.parametrize(("args", "pattern"), USAGE_CASES, ids=[" ".join(a) for a, _ in USAGE_CASES])
def test_bad_option_is_one_usage_line(pytester: pytest.Pytester, args: list[str], pattern: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    usage_error(pytester.runpytest_subprocess(*args), pattern)


def test_ini_twins_are_checked_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    pytester.makeini("[pytest]\nkvaudit_threads = 0\n")
    usage_error(pytester.runpytest_subprocess(), "ERROR: kvaudit_threads (ini)='0' is out of range*")


@pytest.mark.parametrize("flag", [opt.REPORT, opt.HTML])
def test_report_path_that_is_a_directory(pytester: pytest.Pytester, flag: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    d = pytester.mkdir("out")
    usage_error(pytester.runpytest_subprocess(f"{flag}={d}"), f"ERROR: {flag}=*out is a directory: give a file path*")
    usage_error(pytester.runpytest_subprocess(f"{flag}=out/"), f"ERROR: {flag}=out/ is a directory*")


def test_report_path_under_a_file_or_unwritable(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    f = pytester.makefile(".txt", plain="x")
    usage_error(pytester.runpytest_subprocess(f"{opt.REPORT}={f}/sub/r.json"),
                f"ERROR: {opt.REPORT}=*/sub/r.json: *plain.txt is a file, not a folder*")
    # /proc refuses new files even to root, which os.access would wave through
    usage_error(pytester.runpytest_subprocess(f"{opt.HTML}=/proc/kvaudit.html"),
                f"ERROR: {opt.HTML}=/proc/kvaudit.html: cannot write in /proc (*): choose a writable location")


def test_a_report_path_in_a_new_folder_is_fine(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    res = pytester.runpytest_subprocess(f"{opt.REPORT}=new/deeper/r.json")
    res.assert_outcomes(passed=1)
    assert not (pytester.path / "new").exists(), "the check must not create folders"
    assert not list(pytester.path.glob(".*.tmp"))


THRESHOLD_CASES: list[tuple[str, str]] = [
    ("bridge_bitexact.min_unit=3",
     "ERROR: kvaudit_thresholds: claim bridge_bitexact has no threshold 'min_unit'; its thresholds are min_units"),
    ("matched_construction.margin=nan", "ERROR: kvaudit_thresholds: 'matched_construction.margin=nan': *not a finite*"),
    ("matched_construction.margin=wide", "ERROR: kvaudit_thresholds: *'wide' is not a number"),
    ("matched_construction=3", "ERROR: kvaudit_thresholds: 'matched_construction=3' is not 'claim.key=number'"),
    (".min_units=3", "ERROR: kvaudit_thresholds: '.min_units=3' is not 'claim.key=number'"),
]


@pytest.mark.parametrize(("line", "pattern"), THRESHOLD_CASES)
def test_bad_threshold_line_is_one_usage_line(pytester: pytest.Pytester, line: str, pattern: str) -> None:
    pytester.makepyfile("def test_x(): pass")
    pytester.makeini(f"[pytest]\nkvaudit_thresholds =\n    {line}\n")
    usage_error(pytester.runpytest_subprocess(), pattern)


USER_CLAIM = """
from pytest_kvaudit.claims import Claim, Threshold, register

@register
class Mine(Claim):
    name = "my_claim"
    thresholds = {"min_units": Threshold(4, "least units")}

def test_x():
    pass
"""


def test_unknown_claim_name_is_a_usage_error_once_collection_knows_every_claim(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine=USER_CLAIM)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    my_claim.min_units=2\n    brige_bitexact.min_units=3\n")
    usage_error(pytester.runpytest_subprocess(),
                "ERROR: kvaudit_thresholds: no claim named 'brige_bitexact'; known claims: bridge_bitexact, *my_claim*")


def test_a_user_claims_threshold_lines_are_accepted_and_its_keys_checked(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_mine=USER_CLAIM)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    my_claim.min_units=2\n")
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    my_claim.min_unitz=2\n")
    usage_error(pytester.runpytest_subprocess(),
                "ERROR: kvaudit_thresholds: claim my_claim has no threshold 'min_unitz'; its thresholds are min_units")


def test_unknown_claim_in_a_run_of_named_paths_is_named_not_refused(pytester: pytest.Pytester) -> None:
    """The claim may live in a test file this run did not collect: the line is unused, and said so."""
    pytester.makepyfile(test_other="def test_x(): pass")
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    my_claim.min_units=2\n")
    res = pytester.runpytest_subprocess("test_other.py")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["kvaudit: kvaudit_thresholds: no claim named 'my_claim'; *the line was not used"])


# -- A. the same validators, called directly: garbage never escapes as anything but one usage line ----
class StubConfig:
    """What build_config reads from a pytest.Config: options, ini values and the rootdir."""

    def __init__(self, options: dict[str, Any], ini: dict[str, Any] | None = None) -> None:
        self.options, self.ini = options, ini or {}
        self.rootpath = Path("/nonexistent-root")

    def getoption(self, name: str) -> Any:
        return self.options.get(name)

    def getini(self, name: str) -> Any:
        return self.ini.get(name, False if name in {opt.dest(f) for f in opt.FLAG_OPTIONS} else "")


NUMERIC = [opt.N, opt.MAX_NEW_TOKENS, opt.THREADS, opt.DONOR_UNITS, opt.SEED, opt.CHUNKS, opt.BOUNDARY]
garbage = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", " ", "0", "-0", "+1", "1e3", "0x10", "１２", "٣", "1_000", "tokens:", "tokens:-1",
                     "9" * 5000]),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flag=st.sampled_from(NUMERIC), raw=garbage)
def test_garbage_numeric_values_never_escape_as_a_traceback(flag: str, raw: str) -> None:
    try:
        cfg = ov.build_config(StubConfig({opt.dest(flag): raw}))  # type: ignore[arg-type]
    except pytest.UsageError as exc:
        assert flag.removeprefix("--") in str(exc) or "boundary" in str(exc)
        one_line(str(exc))
        return
    # accepted: then it is what the range promises
    lo_hi = ov.INT_RANGES.get(flag)
    if lo_hi is not None and raw.strip():
        got = {opt.N: cfg.n, opt.MAX_NEW_TOKENS: cfg.max_new_tokens, opt.THREADS: cfg.threads,
               opt.DONOR_UNITS: cfg.donor_max_units, opt.SEED: cfg.seed}[flag]
        assert got is not None and got >= lo_hi[0] and (lo_hi[1] is None or got <= lo_hi[1])
    if flag == opt.BOUNDARY and raw:
        assert cfg.boundary == raw
        rule = BoundaryRule.parse(raw)
        assert rule.marker is not None or (rule.tokens is not None and rule.tokens >= 1)


def test_threshold_keys_of_builtin_claims_are_checked_without_a_run() -> None:
    from pytest_kvaudit.claims import registered

    th = thresholds.parse_thresholds(["donor_following.min_units=1", "my_own.x=2"])
    assert thresholds.check_thresholds(th, AuditConfig(), registered()) == ["my_own"]
    with pytest.raises(pytest.UsageError, match="its thresholds are confidence, min_units"):
        thresholds.check_thresholds(thresholds.parse_thresholds(["donor_following.min=1"]), AuditConfig(), registered())


# -- B. items -------------------------------------------------------------------------------------------
def items_file(tmp_path: Path, lines: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Path:
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    if meta is not None:
        (tmp_path / "set.meta.json").write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(("meta", "field", "want"), [
    ({"boundary": 5}, "boundary", "a marker string"),
    ({"max_new_tokens": "abc"}, "max_new_tokens", "a whole number >= 1"),
    ({"max_new_tokens": 0}, "max_new_tokens", "a whole number >= 1"),
    ({"max_new_tokens": True}, "max_new_tokens", "a whole number >= 1"),
    ({"max_new_tokens": 2.5}, "max_new_tokens", "a whole number >= 1"),
    ({"answer_regex": ["x"]}, "answer_regex", "a regex string"),
    ({"answer_regex": ""}, "answer_regex", "is empty"),
    ({"boundary": "tokens:-1"}, "boundary", "tokens:K needs a whole number"),
])
def test_meta_json_of_the_wrong_type_names_file_and_field(tmp_path: Path, meta: dict[str, Any], field: str,
                                                           want: str) -> None:
    from pytest_kvaudit.core.model.items import load_item_set

    path = items_file(tmp_path, [{"id": "a", "prompt": "S12:", "answer": "3"}], meta)
    with pytest.raises(KvauditError) as exc:
        load_item_set(path)
    msg = one_line(str(exc.value))
    assert msg.startswith(f"{tmp_path / 'set.meta.json'}: field '{field}'") and want in msg


@pytest.mark.parametrize(("item", "want"), [
    ({"id": "neg", "prompt_ids": [3, -1], "answer": "1"}, "set.jsonl:2: item 'neg': 'prompt_ids' must be"),
    ({"id": "b", "prompt": "S1:", "answer": "1", "boundary": "tokens:abc"},
     "set.jsonl:2: item 'b': boundary 'tokens:abc'"),
    ({"id": "b", "prompt": "S1:", "answer": "1", "boundary": ""}, "set.jsonl:2: item 'b': --kvaudit-boundary is empty"),
])
def test_bad_item_fields_name_file_and_line(tmp_path: Path, item: dict[str, Any], want: str) -> None:
    from pytest_kvaudit.core.model.items import load_item_set

    path = items_file(tmp_path, [{"id": "a", "prompt": "S12:", "answer": "3"}, item])
    with pytest.raises(KvauditError) as exc:
        load_item_set(path)
    assert want in one_line(str(exc.value))


def store_for(ck: Path, items: Path, **kw: Any) -> Any:
    from pytest_kvaudit.core.compute.store import Store

    return Store.open(AuditConfig(model=str(ck), items=str(items), dtypes=("fp32",), device="cpu", batch_units=2, **kw))


def test_prompt_ids_outside_the_vocabulary_name_file_and_line(tiny_llama: Path, tmp_path: Path) -> None:
    path = items_file(tmp_path, [{"id": "ok", "prompt_ids": [3, 4], "answer": "1"},
                                 {"id": "big", "prompt_ids": [3, 19], "answer": "1"}], {"boundary": "tokens:2"})
    store = store_for(tiny_llama, path)
    with pytest.raises(KvauditError) as exc:
        store.compute()
    msg = one_line(str(exc.value))
    assert f"{path}:2: item 'big': prompt id 19 is outside the vocabulary" in msg and "(19 ids, 0..18)" in msg
    assert not store.records, "refused before any cell is computed"


def test_too_long_and_unreached_items_are_counted_and_listed(tiny_llama: Path, tmp_path: Path) -> None:
    from pytest_kvaudit.report.document import items_block

    huge = "S" + "12" * 1_000_000 + ":"  # 2 MB: refused by length, never fed to the model
    lines = [{"id": "short", "prompt": "S12:", "answer": "3"},
             {"id": "edge", "prompt": "S" + "1" * 104 + ":", "answer": "3"},  # 106 + 24 > 128 positions
             {"id": "huge", "prompt": huge, "answer": "3"},
             {"id": "never", "prompt": "S34:", "answer": "7", "boundary": "|A|A|A|A"}]
    path = items_file(tmp_path, lines, {"boundary": "tokens:2", "max_new_tokens": 24, "answer_regex": r"\|A(\d+)"})
    store = store_for(tiny_llama, path)
    t0 = time.perf_counter()
    store.compute()
    assert time.perf_counter() - t0 < 60
    block = items_block(store.records.values(), [i.id for i in store.items])
    assert block["total"] == 4 and block["ineligible"]["too_long"] == 2
    listed = {(x["id"], x["reason"]): x for x in block["ineligible_items"]}
    assert ("edge", "too_long") in listed and ("huge", "too_long") in listed
    assert listed[("huge", "too_long")]["dtype"] == "fp32" and listed[("huge", "too_long")]["generated_tail"] is None
    unreached = [x for x in block["ineligible_items"] if x["id"] == "never"]
    assert unreached and unreached[0]["reason"] == "boundary_not_reached"
    assert isinstance(unreached[0]["generated_tail"], str) and unreached[0]["generated_tail"]
    assert block["eligible"] == block["total"] - sum(block["ineligible"].values())
    assert store.records[("huge", "fp32")].prompt_ids == (), "judged too long from its characters, never tokenized"
    assert len(store.records[("edge", "fp32")].prompt_ids) == 106


def test_the_untokenized_length_bound_never_calls_a_fitting_prompt_too_long() -> None:
    from pytest_kvaudit.core.compute.cells import surely_too_long
    from pytest_kvaudit.core.model.items import Item

    def item(text: str) -> Item:
        return Item(id="x", answer="1", prompt=text)

    assert surely_too_long(item("ab" * 1000), per_token=20, limit=10)
    assert not surely_too_long(item("ab" * 100), per_token=20, limit=10)  # 200 chars: tokenize to know
    # whitespace and control characters that a tokenizer may drop do not count
    assert not surely_too_long(item("a" + " " * 10_000 + "\x00" * 10_000 + "b"), per_token=20, limit=10)
    assert not surely_too_long(Item(id="x", answer="1", prompt_ids=(1,) * 500), per_token=20, limit=10)
    assert not surely_too_long(item("ab" * 1000), per_token=None, limit=10)


# -- C. models refused up front ------------------------------------------------------------------------
def copy_of(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(ck: Path, **changes: Any) -> None:
    cfg = json.loads((ck / "config.json").read_text())
    cfg.update(changes)
    (ck / "config.json").write_text(json.dumps(cfg))


def edit_weights(ck: Path, fn: Any) -> None:
    from safetensors.torch import load_file, save_file

    f = ck / "model.safetensors"
    save_file(fn(load_file(str(f))), str(f), metadata={"format": "pt"})


def refusal(ck: Path, dtype: str = "fp32") -> str:
    from pytest_kvaudit.core.model.engine_protocol import OpenSpec
    from pytest_kvaudit.core.runtime.loading import open_model

    with pytest.raises(KvauditError) as exc:
        open_model(OpenSpec(str(ck), dtype, "cpu"))
    return one_line(str(exc.value))


def test_missing_layer_weights(tiny_llama: Path, tmp_path: Path) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    edit_weights(ck, lambda sd: {k: v for k, v in sd.items() if ".layers.1." not in k})
    msg = refusal(ck)
    assert "lacks 9 weight(s) that config.json asks for, e.g. model.layers.1." in msg and "at random" in msg


def test_unexpected_weights_from_a_config_with_fewer_layers(tiny_llama: Path, tmp_path: Path) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    edit_config(ck, num_hidden_layers=1)
    msg = refusal(ck)
    assert "holds 9 weight(s) its config.json does not use, e.g. model.layers.1." in msg


def test_weights_whose_shapes_do_not_fit_the_config(tiny_llama: Path, tmp_path: Path) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    edit_config(ck, intermediate_size=48)
    msg = refusal(ck)
    assert "do not fit its config.json (6 shape mismatch(es): model.layers.0.mlp.down_proj.weight" in msg
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:  # 4.x names the keys without their shapes
        assert "down_proj.weight is (32, 64) in the weights, (32, 48) by config.json)" in msg


@pytest.mark.parametrize("keep", [0.5, 0.999, 4 / 1e9])
def test_truncated_safetensors(tiny_llama: Path, tmp_path: Path, keep: float) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    f = ck / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: max(4, int(len(data) * keep))])
    msg = refusal(ck)
    assert "model.safetensors is truncated" in msg and "re-download" in msg


def test_corrupt_safetensors_header(tiny_llama: Path, tmp_path: Path) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    f = ck / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[8:12] = b"\xff\xfe{["
    f.write_bytes(bytes(data))
    assert "safetensors header is corrupt" in refusal(ck)


@pytest.mark.parametrize(("name", "content", "want"), [
    ("config.json", b'{"model_type": "llama", "x": "\xff\xfe"}', "config.json: not UTF-8 text (byte"),
    ("config.json", b'{"model_type": "llama",', "config.json: not valid JSON"),
    ("tokenizer.json", b'{"version": "1.0", "model": ', "tokenizer.json: not valid JSON"),
    ("tokenizer.json", b"\x80\x81", "tokenizer.json: not UTF-8 text"),
    ("tokenizer_config.json", b"\xc3\x28", "tokenizer_config.json: not UTF-8 text"),
    ("generation_config.json", b"[1, 2", "generation_config.json: not valid JSON"),
])
def test_checkpoint_json_that_is_not_utf8_or_not_json(tiny_llama: Path, tmp_path: Path, name: str, content: bytes,
                                                      want: str) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    (ck / name).write_bytes(content)
    msg = refusal(ck)
    assert want in msg and "restore it from the original checkpoint" in msg


def test_encoder_decoder_config_is_refused_before_loading(tiny_llama: Path, tmp_path: Path) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    edit_config(ck, is_encoder_decoder=True)
    assert "is an encoder-decoder model (llama): kvaudit audits decoder-only causal LMs" in refusal(ck)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A bidirectional BERT that loads through AutoModelForCausalLM (BertLMHeadModel, is_decoder false);
    a wide init makes its attention sharp enough that bf16 rounding cannot hide it."""
    from transformers import BertConfig, BertLMHeadModel

    from pytest_kvaudit.testing import char_vocab, save_char_tokenizer

    out = tmp_path_factory.mktemp("bert")
    cfg = BertConfig(vocab_size=len(char_vocab()), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, is_decoder=False, pad_token_id=0,
                     initializer_range=2.0)
    BertLMHeadModel(cfg).save_pretrained(str(out))
    save_char_tokenizer(out)
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bidirectional_encoder_is_refused(tiny_bert: Path, dtype: str) -> None:
    msg = refusal(tiny_bert, dtype)
    assert "(BertLMHeadModel) is not causal: changing the last token moved the logits at earlier positions" in msg


class FakeLM:
    """A model whose logits at position i are a function of the tokens at ``window(i)``, plus ``noise``."""

    def __init__(self, future: bool, noise: float = 0.0) -> None:
        import torch

        self.future, self.noise, self.dtype, self.device = future, noise, torch.float32, torch.device("cpu")
        self.emb = SimpleNamespace(weight=torch.zeros(19, 4))

    def get_input_embeddings(self) -> Any:
        return self.emb

    def __call__(self, input_ids: Any, use_cache: bool = False) -> Any:

        x = input_ids.float()
        seen = x.flip(-1).cumsum(-1).flip(-1) if self.future else x.cumsum(-1)
        logits = seen[..., None].repeat(1, 1, 19) / 10
        logits = logits + self.noise * (input_ids[..., -1:, None].float() % 2)  # rounding-sized, from the last token
        return SimpleNamespace(logits=logits)


def test_the_causality_probe_on_stand_in_models() -> None:
    from pytest_kvaudit.core.runtime.refusals import check_causal

    check_causal(FakeLM(future=False), Path("causal"))
    check_causal(FakeLM(future=False, noise=1e-7), Path("moe-like"))  # a few ulps: an expert GEMM's rounding
    with pytest.raises(KvauditError, match="not causal"):
        check_causal(FakeLM(future=True), Path("encoder"))
    with pytest.raises(KvauditError, match="not causal"):
        check_causal(FakeLM(future=False, noise=1e-2), Path("leaky"))


def test_a_broken_checkpoint_is_one_line_per_claim_in_a_run(pytester: pytest.Pytester, tiny_llama: Path,
                                                             tmp_path: Path) -> None:
    ck = copy_of(tiny_llama, tmp_path / "ck")
    edit_weights(ck, lambda sd: {k: v for k, v in sd.items() if ".layers.0.mlp." not in k})
    pytester.makepyfile(test_mine="""
def test_claim(kvaudit_judge):
    kvaudit_judge.claim("bridge_bitexact")
""")
    res = pytester.runpytest_subprocess(f"--kvaudit-model={ck}", "--kvaudit-dtypes=fp32",
                                        "test_mine.py")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*checkpoint */ck lacks 3 weight(s) that config.json asks for, "
                              "e.g. model.layers.0.mlp.*"])
    out = res.stdout.str() + res.stderr.str()
    assert "Traceback" not in out and "LOAD REPORT" not in out


BRIDGE = """
import pytest

@pytest.mark.kvaudit_claim("bridge_bitexact")
def test_bridge(kvaudit_judge):
    kvaudit_judge.claim()
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["n0", "n2"])
def test_a_threshold_no_claim_read_fails_a_strict_gate(pytester: pytest.Pytester, tiny_llama: Path,
                                                       xdist: list[str]) -> None:
    """A CI gate with a typo in a threshold would gate nothing: under --kvaudit-strict the run fails, naming the
    line and the known claims; without it the line is only named (a run of a few files may leave lines unread)."""
    pytester.makepyfile(test_mine=BRIDGE)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    bridge_bitexact.min_units=1\n    no_such_claim.min_units=1\n")
    args = [*xdist, f"--kvaudit-model={tiny_llama}", "--kvaudit-n=2", "--kvaudit-dtypes=fp32", "-p", "no:cacheprovider",
            "test_mine.py"]
    pytester.runpytest_subprocess(*args).assert_outcomes(passed=1)
    res = pytester.runpytest_subprocess(*args, "--kvaudit-strict")
    res.assert_outcomes(passed=1)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["kvaudit: FAILED: --kvaudit-strict: kvaudit_thresholds line 'no_such_claim.min_units=1' "
                              "read by no claim of this run (judged: bridge_bitexact); known claims: bridge_bitexact, "
                              "donor_following, *"])
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    bridge_bitexact.min_units=1\n")
    assert pytester.runpytest_subprocess(*args, "--kvaudit-strict").ret == pytest.ExitCode.OK


def test_a_registered_schedule_on_vllm_is_refused_at_configure(pytester: pytest.Pytester) -> None:
    """vLLM's constructions are requests: a chunk schedule of forwards is one line before anything loads."""
    pytester.makeconftest("from pytest_kvaudit.core.model.schedules import register_schedule\n\n"
                          "@register_schedule('halves')\ndef halves(prompt_len, length, arg):\n"
                          "    return [length // 2, length - length // 2] if length > 1 else [length]\n")
    pytester.makepyfile("def test_x(): pass")
    usage_error(pytester.runpytest_subprocess("--kvaudit-backend=vllm"),
                "ERROR: --kvaudit-backend=vllm serves requests: the registered schedule(s) halves are chunk schedules*")


def test_engine_args_from_the_ini_are_checked_too(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(): pass")
    pytester.makeini("[pytest]\nkvaudit_engine_arg =\n    block_size=16\n    block_size\n")
    usage_error(pytester.runpytest_subprocess("--kvaudit-backend=vllm"),
                "ERROR: kvaudit_engine_arg (ini) 'block_size': give KEY=VALUE*")
