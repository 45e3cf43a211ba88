"""One cell: an item at one precision, computed in the steps :mod:`pytest_kvaudit.core.model.pipeline` declares, and
the typed record it leaves.

The steps, top to bottom (:meth:`CellBuilder.compute`; the constructions and the 2x2's cells are read from
the pipeline's declaration, so a registered schedule runs here with nothing else to edit):

1. ``trajectory``: greedy generation with a retained cache; the boundary fixes the prefix ids, and the
   live boundary state is kept. An item that never reaches its boundary stops here, ineligible.
2. ``replica``: the whole trajectory once more, for replica exactness.
3. ``constructions``: every other construction over the same ``prefix[:-1]`` ids, each as
   build the state (its chunk schedule) -> fingerprint -> continue -> extract the label.
4. ``fixed_prefix``: the 2x2's own cells on the first precision's prefix ids, always computed afresh
   (also where this precision's own trajectory was ineligible), so that recurrence is a second observation.
5. ``anatomy``: how far the live and prefill states are apart (which layers differ), and where their
   suffixes part.
6. ``transplants``: on divergent items, each boundary state continued from the other's K/V, and the
   controls: a sham (the receiver's own cache through the same transplant path) and a transplant of only
   the layers whose K/V are bit-identical in the two states; neither may change the receiver's suffix.

The caches go with the builder's frame; the record keeps only ids, suffixes, labels and fingerprints:
plain data that pickles and JSON-serialises, so xdist workers and shards can ship it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from pytest_kvaudit.core.compute.transplants import anatomy, transplants
from pytest_kvaudit.core.errors import UnsupportedCacheError
from pytest_kvaudit.core.model.config import AuditConfig, BoundaryRule
from pytest_kvaudit.core.model.items import Item, ItemSet, extract_answer, token_text
from pytest_kvaudit.core.model.pipeline import FIXED, LIVE, LIVE_REPLICA, Step, constructions, replicates
from pytest_kvaudit.core.model.records import (
    TAIL_CHARS,
    TAIL_TOKENS,
    TOO_LONG,
    CellRecord,
    Continuation,
)
from pytest_kvaudit.core.model.schedules import schedule
from pytest_kvaudit.core.runtime import state as kv
from pytest_kvaudit.core.runtime.chat import chat_prompt_ids
from pytest_kvaudit.core.runtime.decoder import Cost, Decoder, continue_greedy, trajectory


def chars_per_token(tokenizer: Any) -> int | None:
    """An upper bound on the visible characters one token covers: the longest vocabulary string, times 4 for
    normalizers that compose characters (NFC) or strip accents. None when the tokenizer has no vocabulary."""
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=0)
    except Exception:  # a tokenizer without get_vocab: always tokenize
        return None
    return 4 * longest if longest else None


def surely_too_long(item: Item, per_token: int | None, limit: int | None) -> bool:
    """Whether a text prompt cannot fit ``limit`` positions, judged without tokenizing it: a 2 MB prompt takes
    seconds per encoding. Only visible characters count (tokenizers may drop whitespace and control
    characters), so the bound never calls a prompt too long that would fit."""
    if item.prompt is None or per_token is None or limit is None or len(item.prompt) <= per_token * limit:
        return False
    visible = sum(1 for c in item.prompt if c.isprintable() and not c.isspace())
    return visible > per_token * limit


def prompt_ids(item: Item, tokenizer: Any, chat_template: bool | None, model: str | None = None) -> tuple[int, ...]:
    """The item's prompt as ids: given, or encoded (in the chat template when on, or when the tokenizer has one
    and the run left it to auto: ``None``, which a resolved config no longer holds)."""
    if item.prompt_ids is not None:
        return item.prompt_ids
    assert item.prompt is not None
    if chat_template or (chat_template is None and getattr(tokenizer, "chat_template", None)):
        return chat_prompt_ids(tokenizer, item.prompt, model)
    return tuple(tokenizer(item.prompt, add_special_tokens=True)["input_ids"])


#: a transplant: (receiver, donor, layers, parts) -> the receiver's state with the donor's K/V in those layers
TransplantFn = Callable[[Any, Any, Any, str], Any]


class CellBuilder:
    """Computes cells at one precision with one decoder; each step below is one method."""

    def __init__(self, dec: Decoder, tokenizer: Any, cfg: AuditConfig, item_set: ItemSet,
                 transplant: TransplantFn | None = None, max_positions: int | None = None) -> None:
        self.dec, self.tok, self.cfg, self.item_set = dec, tokenizer, cfg, item_set
        self.engine = cfg.engine  # its own constructions, what it lacks, and what reads its states:
        self.kv: Any = self.engine.state_reader
        self.max_positions = max_positions
        #: each layer's kind (full, sliding(W), recurrent...), read off the first boundary state
        self.layer_kinds: list[str] | None = None
        self.per_token = chars_per_token(tokenizer) if max_positions is not None else None
        self.cost: Cost = dec.cost
        self.transplant_fn = transplant or self.kv.transplant
        #: each item's place in the whole set (every shard and worker agrees on it): the exact claims' work
        #: follows it (:func:`pytest_kvaudit.core.model.pipeline.exact_item`)
        self.index = {it.id: i for i, it in enumerate(item_set.items)}

    def decode(self, ids: Sequence[int]) -> str:
        return token_text(self.tok, ids)

    # -- the pipeline --------------------------------------------------------------------------
    def compute(self, item: Item, dtype: str, fixed_prefix: tuple[int, ...] | None,
                grant: Callable[[], tuple[bool, ...]]) -> tuple[CellRecord, tuple[int, ...] | None]:
        """The cell of ``item`` at ``dtype``; also returns its prefix (None when ineligible).

        ``grant()`` says, for a divergent unit only, whether it gets the transplants and the layer sweep
        (the run's budgets go to the first divergent units in a single run's order; under xdist the answer
        may wait for another worker's unit before this one)."""
        rule = BoundaryRule.parse(item.boundary or self.item_set.boundary)
        if surely_too_long(item, self.per_token, self.max_positions):  # not even tokenized
            return CellRecord(item.id, dtype, (), (), None, TOO_LONG, item.answer), None
        prompt = prompt_ids(item, self.tok, self.cfg.chat_template, self.cfg.model)
        if self.max_positions is not None and len(prompt) + self.item_set.max_new_tokens > self.max_positions:
            # positions past the model's limit: no forward at all
            return CellRecord(item.id, dtype, prompt, (), None, TOO_LONG, item.answer), None
        rec, tr = self.trajectory(item, dtype, prompt, rule)
        primary, cfg = dtype == self.cfg.primary_dtype, self.cfg
        if tr.reason is not None:
            # the 2x2 judges every precision on the first one's prefix ids, whatever this trajectory did
            if not primary and cfg.computes("fixed"):
                self.fixed_prefix(rec, prompt, fixed_prefix)
            return rec, None
        live_state, last, head = tr.state, tr.prefix[-1], list(tr.prefix[:-1])
        budget = self.item_set.max_new_tokens - tr.boundary  # type: ignore[operator]
        index = self.index.get(item.id)
        if replicates(cfg, index):  # each step below runs when a selected claim reads it (cfg.work)
            self.replica(rec, prompt, rule, tr.boundary)
        prefill_state = self.constructions(rec, prompt, head, last, budget, live_state, index)
        if cfg.computes("fixed"):  # the first precision's own prefix fixes the 2x2's ids for every precision
            self.fixed_prefix(rec, prompt, tr.prefix if primary else fixed_prefix)
        self.anatomy(rec, live_state, prefill_state)
        if (cfg.computes("transplants") and rec.unsupported is None
                and rec.constructions["live"].suffix != rec.constructions["prefill"].suffix):
            donors, sweep = grant()
            if donors:  # a backend that keeps its state whole has no layers to sweep
                self.transplants(rec, live_state, prefill_state, last, budget,
                                 sweep and "per_layer" not in self.engine.lacks)
        return rec, tr.prefix

    def trajectory(self, item: Item, dtype: str, prompt: tuple[int, ...], rule: BoundaryRule) -> tuple[CellRecord, Any]:
        self.dec.path = LIVE.name
        tr = trajectory(self.dec, prompt, self.item_set.max_new_tokens, rule, self.decode, keep_state=True)
        rec = CellRecord(item.id, dtype, tr.prompt_ids, tr.generated, tr.boundary, tr.reason, item.answer)
        if tr.boundary is None:
            rec.generated_tail = self.decode(tr.generated[-TAIL_TOKENS:])[-TAIL_CHARS:]
        if tr.reason is None:
            try:
                self.kv.check_supported(tr.state)
                if self.layer_kinds is None:
                    self.layer_kinds = self.kv.kinds(tr.state)
            except UnsupportedCacheError as exc:
                rec.unsupported = str(exc)
            rec.constructions[LIVE.name] = self.labelled(rec, tr.suffix, tr.state_fp or "", tr.logits_fp or "",
                                                      tr.margins, tr.generated[: tr.boundary])
        return rec, tr

    def replica(self, rec: CellRecord, prompt: tuple[int, ...], rule: BoundaryRule, boundary: int | None) -> None:
        """The same construction a second time: the whole trajectory, regenerated."""
        self.dec.path = LIVE_REPLICA.name
        rep = trajectory(self.dec, prompt, self.item_set.max_new_tokens, rule, self.decode)
        c = Continuation(rep.generated, rep.state_fp or "", "", None, False)
        if rep.boundary == boundary and rep.reason is None:
            c = self.labelled(rec, rep.suffix, rep.state_fp or "", rep.logits_fp or "", (),
                              rep.generated[: rep.boundary])
        rec.constructions[LIVE_REPLICA.name] = c

    def constructions(self, rec: CellRecord, prompt: tuple[int, ...], head: list[int], last: int, budget: int,
                      live_state: Any, index: int | None = None) -> Any:
        """Every construction :func:`~pytest_kvaudit.core.model.pipeline.constructions` declares for an item
        (``index``: its place); returns the boundary state kept for the anatomy and the transplants (prefill's)."""
        kept = None
        for step in constructions(self.cfg, index):
            against = live_state if step.bridge and rec.unsupported is None else None
            cont, state = self.construction(rec, step, prompt, head, last, budget, against=against, live=live_state)
            rec.constructions[step.name] = cont
            if step.keep:
                kept = state
        return kept

    def construction(self, rec: CellRecord, step: Step, prompt: Sequence[int], ids: Sequence[int], last: int,
                     budget: int, against: Any = None, live: Any = None) -> tuple[Continuation, Any]:
        """Build ``step``'s state over ``ids`` in its schedule (or by the backend's own means, for the
        constructions it declares) -> fingerprint -> continue from ``last`` -> extract the label; the state is
        returned when the step keeps it."""
        self.dec.path = step.name
        reused = None
        if step.schedule in self.engine.constructions_at(self.cfg.batch_size):
            state, reused = self.dec.construct(step.schedule, ids, len(prompt), live)
        else:
            state = self.dec.build_state(ids, schedule(step.schedule, len(prompt), len(ids)))
        if against is not None:
            rec.comparison.bridge_mismatch = [
                f"{c.layer}:{part}" for c in self.kv.compare(state, against)
                for part, same in (("k", c.keys_equal), ("v", c.values_equal)) if not same
            ]
        fp = self.kv.fingerprint(state)
        kept = self.kv.clone(state) if step.keep else None
        margins: list[float] = []
        suffix, lfp = continue_greedy(self.dec, state, last, budget, margins)
        # the label reads the generated part of the prefix this continuation extends
        cont = self.labelled(rec, suffix, fp, lfp, margins, list(ids[len(prompt):]) + [last])
        return (replace(cont, reused=reused) if reused is not None else cont), kept

    def labelled(self, rec: CellRecord, suffix: tuple[int, ...], state_fp: str, logits_fp: str,
                 margins: Sequence[float], gen_head: Sequence[int]) -> Continuation:
        ans = extract_answer(self.decode(list(gen_head) + list(suffix)), self.item_set.answer_regex)
        return Continuation(suffix, state_fp, logits_fp, ans, ans is not None and ans == rec.answer,
                            tuple(round(m, 6) for m in margins), self.decode(suffix))

    def fixed_prefix(self, rec: CellRecord, prompt: tuple[int, ...], fixed: tuple[int, ...] | None) -> None:
        """The 2x2 at this precision on the first precision's prefix ids: its own two cells on fresh caches
        (teacher-forced replay and one-shot prefill), never the matched run's cells, so that recurrence is
        observed a second time rather than read back from the same computation."""
        if fixed is None:
            return
        rec.fixed_prefix_fp = kv.fingerprint_ids(fixed)
        rec.fixed_prefix_len = len(fixed)
        budget = self.item_set.max_new_tokens - (len(fixed) - len(prompt))
        if budget > 0 and len(fixed) >= 2:
            ids, last = list(fixed[:-1]), fixed[-1]
            rec.fixed = {step.name.split(":")[1]: self.construction(rec, step, prompt, ids, last, budget)[0]
                         for step in FIXED}

    def anatomy(self, rec: CellRecord, live_state: Any, prefill_state: Any) -> None:
        anatomy(self, rec, live_state, prefill_state)

    def transplants(self, rec: CellRecord, live_state: Any, prefill_state: Any, last: int, budget: int,
                    sweep: bool) -> None:
        transplants(self, rec, live_state, prefill_state, last, budget, sweep, self.cfg.computes("controls"))
