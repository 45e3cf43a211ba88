"""The embedded checkpoint's second item set, ``items-labels.jsonl``: divergent suffixes change labels.

The first set labels the final sum, which every order of additions reaches, so its label disagreements are
0 and ``matched_construction``'s accuracy statistics only ever see empty discordant cells. This set labels
the order ("the first step after the boundary adds the smallest remaining term"), so BF16 live vs prefill
divergence at that near-tie changes labels, and the paired bootstrap and McNemar run on non-zero discordant
pairs. Built by ``fixtures/make_label_items.py``; ``pytest suites/test_matched_construction.py
--kvaudit-items=fixtures/embedded/items-labels.jsonl`` judges all 200.
"""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest

from kvtest import REPO
from pytest_kvaudit.core.model.config import EMBEDDED_DIR
from pytest_kvaudit.core.model.items import extract_answer, load_item_set

LABELS = EMBEDDED_DIR / "items-labels.jsonl"
#: items the run below judges: the whole set. BF16 bits depend on the CPU, and so does which items change
#: labels: 3 of the first 40 on an AVX512-BF16 Xeon, none of the first 40 but 5 of the 200 on an AVX2 AMD EPYC
FIRST = 200
#: the label is the second step's result: 20 generated tokens cover ``9+8=17;17+9=26;`` (15), so the labels
#: equal those of the set's own 96-token runs (greedy decoding does not look ahead), at a fifth of the cost
MAX_NEW_TOKENS = 20


def test_the_set_is_well_formed_and_its_gold_is_the_smallest_next_term() -> None:
    s = load_item_set(LABELS)
    assert len(s.items) == 200 and len({i.prompt for i in s.items}) == 200
    assert (s.boundary, s.max_new_tokens) == (";", 96)
    for line in LABELS.read_text().splitlines():
        o = json.loads(line)
        terms = [int(c) for c in o["prompt"][1:-1]]
        a, b, total = (int(x) for x in re.fullmatch(r"(\d+)\+(\d+)=(\d+);", o["first_step"]).groups())
        rest = list(terms)
        rest.remove(a)
        rest.remove(b)
        assert a + b == total and sorted(rest) == o["remaining"] and o["answer"] == str(total + min(rest))
        # the regex reads the generated text from its first token: the second step's result
        assert extract_answer(f"{o['first_step']}{total}+{min(rest)}={o['answer']};", s.answer_regex) == o["answer"]
    assert extract_answer("2+5=7;7+1=8;8+3=11;", s.answer_regex) == "8"
    assert extract_answer("2+5=7;7+1=8", s.answer_regex) is None  # an unfinished step is no answer


def test_the_first_set_is_untouched() -> None:
    first = load_item_set(EMBEDDED_DIR / "items.jsonl")
    assert len(first.items) == 200 and first.answer_regex == r"\|A(\d+)" and first.items[0].prompt == "S2514683:"


def test_bf16_divergence_changes_labels_and_fp32_none(pytester: pytest.Pytester) -> None:
    shutil.copy(REPO / "suites" / "test_matched_construction.py", pytester.path)
    pytester.makeini("[pytest]\nkvaudit_thresholds =\n    matched_construction.min_units=20\n")
    rep = pytester.path / "r.json"
    res = pytester.runpytest_subprocess(f"--kvaudit-items={LABELS}", f"--kvaudit-n={FIRST}",
                                        f"--kvaudit-max-new-tokens={MAX_NEW_TOKENS}", f"--kvaudit-report={rep}",
                                        "-p", "no:cacheprovider")
    assert res.ret in (0, 1), res.stdout.str()[-2000:]
    c = json.loads(rep.read_text())["claims"]["matched_construction"]
    f = c["figures"]
    assert f["n"] == {"bf16": FIRST, "fp32": FIRST}
    assert f["labels_extracted"]["bf16"] == [FIRST, FIRST] and f["labels_extracted"]["fp32"] == [FIRST, FIRST]
    assert f["label_disagreements"]["bf16"] >= 1 and f["label_disagreements"]["fp32"] == 0
    assert f["divergent_suffixes"]["bf16"] >= f["label_disagreements"]["bf16"] and f["divergent_suffixes"]["fp32"] == 0
    # the discordant pairs (live right / prefill right) are the label disagreements, and the statistics see them
    assert sum(f["discordant"]["bf16"]) == f["label_disagreements"]["bf16"] and f["discordant"]["fp32"] == [0, 0]
    for d in ("bf16", "fp32"):
        low, high = f["accuracy_diff_ci"][d]
        values = [f["accuracy_live"][d], f["accuracy_prefill"][d], f["accuracy_diff"][d], low, high, f["mcnemar_p"][d]]
        assert all(math.isfinite(v) for v in values), (d, values)
        assert low <= f["accuracy_diff"][d] <= high and 0 <= f["mcnemar_p"][d] <= 1
    assert f["accuracy_live"]["bf16"] - f["accuracy_prefill"]["bf16"] == pytest.approx(f["accuracy_diff"]["bf16"])
    low, high = f["accuracy_diff_ci"]["bf16"]
    assert low < high  # discordant pairs: the bootstrap resamples something
    assert c["status"] in ("pass", "inconclusive", "fail") and c["n"] == 2 * FIRST
