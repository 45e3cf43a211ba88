"""One cell: an item at one precision, computed in named steps, and the typed record it leaves.

The steps, top to bottom (:meth:`CellBuilder.compute`):

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
from dataclasses import asdict, dataclass, field
from typing import Any

from . import cache as kv
from .chat import chat_prompt_ids
from .config import AuditConfig, BoundaryRule
from .constructions import Continuation, Cost, Decoder, continue_greedy, trajectory
from .errors import UnsupportedCacheError
from .items import Item, ItemSet, extract_answer
from .schedules import schedule

#: the constructions every cell computes besides ``live``; ``--kvaudit-chunks`` adds ``chunked(c)``
BASE_CONSTRUCTIONS = ("prefill", "incremental")
#: ineligible: prompt + max_new_tokens exceed the model's position limit
TOO_LONG = "too_long"
#: how much of a generation that missed its boundary the report shows
TAIL_TOKENS, TAIL_CHARS = 48, 120


#: what a transplant is for: the donor's K/V (the claim and the sweep), or one of the two controls
DONOR, SHAM, IDENTICAL = "donor", "sham", "identical"


@dataclass
class Transplant:
    """A receiver continued from its donor's K/V at the boundary."""

    direction: str  # "<donor>_to_<receiver>": live_to_prefill, prefill_to_live; a sham's is prefill_to_prefill
    layers: tuple[int, ...] | None  # None = all layers
    parts: str  # "kv", "k" or "v"
    suffix: tuple[int, ...]
    followed: bool  # receiver's suffix equals the donor's, token for token
    #: donor (the claim's transplant and the sweep's subsets), sham or identical (the controls)
    kind: str = DONOR
    #: the receiver's suffix is its own untransplanted one, token for token (a control must keep this)
    held: bool = False
    margins: tuple[float, ...] = ()
    text: str = ""

    @property
    def whole(self) -> bool:
        """The all-layer K and V transplant that donor_following judges (the rest are the layer sweep)."""
        return self.kind == DONOR and self.layers is None and self.parts == "kv"

    @property
    def receiver(self) -> str:
        return self.direction.rsplit("_to_", 1)[-1]

    @property
    def donor(self) -> str:
        return self.direction.split("_to_", 1)[0]


@dataclass
class Comparison:
    """The live boundary state set against the others, layer by layer."""

    #: layers whose K or V differ between the incremental replay and the live cache ("3:k", "3:v")
    bridge_mismatch: list[str] = field(default_factory=list)
    #: per layer [layer, K max-abs, V max-abs, K relative, V relative] between live and prefill states
    drift: list[list[float]] = field(default_factory=list)
    #: the decoded tokens where live and prefill first part, for people reading the anatomy
    divergence_text: list[str] = field(default_factory=list)
    #: layers whose K or V differ (not bit-identical) between the live and prefill states, and the rest
    differing_layers: list[int] = field(default_factory=list)
    identical_layers: list[int] = field(default_factory=list)


@dataclass
class Probes:
    """Outcomes of the per-precision probes beyond the claims (see :mod:`.probes`)."""

    axes: dict[str, dict[str, Any]] = field(default_factory=dict)  # attention implementation -> outcome
    batch: dict[str, Any] = field(default_factory=dict)  # batch invariance outcome
    cache: dict[str, dict[str, Any]] = field(default_factory=dict)  # cache layout (static) -> outcome


@dataclass
class CellRecord:
    """One item at one precision: the trajectory, every construction's continuation, the transplants."""

    item_id: str
    dtype: str
    prompt_ids: tuple[int, ...]
    generated: tuple[int, ...]
    boundary: int | None
    reason: str | None  # why the item is ineligible
    answer: str
    constructions: dict[str, Continuation] = field(default_factory=dict)
    #: the fixed-prefix 2x2's own cells ("replay", "prefill") at this precision on the first precision's
    #: prefix ids, computed on fresh caches (also when this precision's trajectory was ineligible)
    fixed: dict[str, Continuation] = field(default_factory=dict)
    fixed_prefix_fp: str | None = None
    fixed_prefix_len: int | None = None
    transplants: list[Transplant] = field(default_factory=list)
    comparison: Comparison = field(default_factory=Comparison)
    probes: Probes = field(default_factory=Probes)
    unsupported: str | None = None  # why K/V operations do not apply to this model
    error: str | None = None  # an error on this item alone (out of memory), the run went on
    #: the end of what the model generated, decoded, when it never reached the boundary (for the report)
    generated_tail: str | None = None

    @property
    def eligible(self) -> bool:
        return self.reason is None and self.error is None

    @property
    def prefix(self) -> tuple[int, ...]:
        assert self.boundary is not None
        return self.prompt_ids + self.generated[: self.boundary]

    @property
    def prefix_fp(self) -> str:
        return kv.fingerprint_ids(self.prefix)

    @property
    def bridge_mismatch(self) -> list[str]:
        return self.comparison.bridge_mismatch

    @property
    def drift(self) -> list[list[float]]:
        return self.comparison.drift

    def whole_transplants(self) -> list[Transplant]:
        return [t for t in self.transplants if t.whole]

    def controls(self, kind: str) -> list[Transplant]:
        """donor_following's controls of one ``kind`` (sham or identical) on this record."""
        return [t for t in self.transplants if t.kind == kind]

    @property
    def recurrence_comparable(self) -> bool:
        """This precision's own prefix is the 2x2's fixed prefix, id for id: its matched live-vs-prefill
        comparison and the 2x2's replay-vs-prefill comparison are over the same ids."""
        return self.eligible and bool(self.fixed) and self.fixed_prefix_fp == self.prefix_fp

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellRecord:
        d = dict(d)
        d["prompt_ids"] = tuple(d["prompt_ids"])
        d["generated"] = tuple(d["generated"])
        d["constructions"] = {k: _cont(v) for k, v in d["constructions"].items()}
        d["fixed"] = {k: _cont(v) for k, v in d["fixed"].items()}
        d["transplants"] = [
            Transplant(**{**t, "suffix": tuple(t["suffix"]), "layers": None if t["layers"] is None else tuple(t["layers"]),
                          "margins": tuple(t.get("margins", ()))})
            for t in d["transplants"]
        ]
        d["comparison"] = Comparison(**d["comparison"])
        d["probes"] = Probes(**d["probes"])
        return cls(**d)


def _cont(v: dict[str, Any]) -> Continuation:
    return Continuation(**{**v, "suffix": tuple(v["suffix"]), "margins": tuple(v.get("margins", ()))})


def sweep_subsets(n_layers: int) -> list[tuple[tuple[int, ...] | None, str]]:
    """The layer sweep: each single layer, the first j and the last j layers, and K only / V only."""
    out: list[tuple[tuple[int, ...] | None, str]] = [((i,), "kv") for i in range(n_layers)]
    for j in range(1, n_layers):
        out.append((tuple(range(j)), "kv"))
        out.append((tuple(range(n_layers - j, n_layers)), "kv"))
    out += [(None, "k"), (None, "v")]
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


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


def prompt_ids(item: Item, tokenizer: Any, chat_template: bool, model: str | None = None) -> tuple[int, ...]:
    """The item's prompt as ids: given, or encoded (in the chat template when asked)."""
    if item.prompt_ids is not None:
        return item.prompt_ids
    assert item.prompt is not None
    if chat_template:
        return chat_prompt_ids(tokenizer, item.prompt, model)
    return tuple(tokenizer(item.prompt, add_special_tokens=True)["input_ids"])


class CellBuilder:
    """Computes cells at one precision with one decoder; each step below is one method."""

    def __init__(self, dec: Decoder, tokenizer: Any, cfg: AuditConfig, item_set: ItemSet,
                 transplant: Callable[[Any, Any, Any, str], Any] | None = None, max_positions: int | None = None) -> None:
        self.dec, self.tok, self.cfg, self.item_set = dec, tokenizer, cfg, item_set
        self.max_positions = max_positions
        self.per_token = chars_per_token(tokenizer) if max_positions is not None else None
        self.cost: Cost = dec.cost
        self.transplant_fn = transplant or kv.transplant

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=False))

    # -- the pipeline --------------------------------------------------------------------------
    def compute(self, item: Item, dtype: str, fixed_prefix: tuple[int, ...] | None, donors: bool,
                sweep: bool) -> tuple[CellRecord, tuple[int, ...] | None]:
        """The cell of ``item`` at ``dtype``; also returns its prefix (None when ineligible)."""
        rule = BoundaryRule.parse(item.boundary or self.item_set.boundary)
        if surely_too_long(item, self.per_token, self.max_positions):  # not even tokenized
            return CellRecord(item.id, dtype, (), (), None, TOO_LONG, item.answer), None
        prompt = prompt_ids(item, self.tok, self.cfg.chat_template, self.cfg.model)
        if self.max_positions is not None and len(prompt) + self.item_set.max_new_tokens > self.max_positions:
            # positions past the model's limit: no forward at all
            return CellRecord(item.id, dtype, prompt, (), None, TOO_LONG, item.answer), None
        rec, tr = self.trajectory(item, dtype, prompt, rule)
        primary = dtype == self.cfg.primary_dtype
        if tr.reason is not None:
            # the 2x2 judges every precision on the first one's prefix ids, whatever this trajectory did
            if not primary:
                self.fixed_prefix(rec, prompt, fixed_prefix)
            return rec, None
        live_state, last = tr.state, tr.prefix[-1]
        head = list(tr.prefix[:-1])
        budget = self.item_set.max_new_tokens - tr.boundary  # type: ignore[operator]
        self.replica(rec, prompt, rule, tr.boundary)
        prefill_state = self.constructions(rec, prompt, head, last, budget, live_state)
        # the first precision's own prefix fixes the 2x2's ids for every precision
        self.fixed_prefix(rec, prompt, tr.prefix if primary else fixed_prefix)
        self.anatomy(rec, live_state, prefill_state)
        if donors and rec.unsupported is None and rec.constructions["live"].suffix != rec.constructions["prefill"].suffix:
            self.transplants(rec, live_state, prefill_state, last, budget, sweep)
        return rec, tr.prefix

    def trajectory(self, item: Item, dtype: str, prompt: tuple[int, ...], rule: BoundaryRule) -> tuple[CellRecord, Any]:
        self.dec.path = "live"
        tr = trajectory(self.dec, prompt, self.item_set.max_new_tokens, rule, self.decode, keep_state=True)
        rec = CellRecord(item.id, dtype, tr.prompt_ids, tr.generated, tr.boundary, tr.reason, item.answer)
        if tr.boundary is None:
            rec.generated_tail = self.decode(tr.generated[-TAIL_TOKENS:])[-TAIL_CHARS:]
        if tr.reason is None:
            try:
                kv.check_plain_kv(tr.state)
            except UnsupportedCacheError as exc:
                rec.unsupported = str(exc)
            rec.constructions["live"] = self.labelled(rec, tr.suffix, tr.state_fp or "", tr.logits_fp or "",
                                                      tr.margins, tr.generated[: tr.boundary])
        return rec, tr

    def replica(self, rec: CellRecord, prompt: tuple[int, ...], rule: BoundaryRule, boundary: int | None) -> None:
        """The same construction a second time: the whole trajectory, regenerated."""
        self.dec.path = "live:replica"
        rep = trajectory(self.dec, prompt, self.item_set.max_new_tokens, rule, self.decode)
        if rep.boundary == boundary and rep.reason is None:
            c = self.labelled(rec, rep.suffix, rep.state_fp or "", rep.logits_fp or "", (), rep.generated[: rep.boundary])
        else:
            c = Continuation(rep.generated, rep.state_fp or "", "", None, False)
        rec.constructions["live:replica"] = c

    def constructions(self, rec: CellRecord, prompt: tuple[int, ...], head: list[int], last: int, budget: int,
                      live_state: Any) -> Any:
        """prefill (and its replica), incremental (compared with the live state), chunked(c); returns the
        prefill boundary state for the anatomy and the transplants."""
        names = [*BASE_CONSTRUCTIONS, *(f"chunked({c})" for c in self.cfg.chunks)]
        prefill_state = None
        for name in names:
            against = live_state if name == "incremental" and rec.unsupported is None else None
            cont, state = self.construction(rec, name, prompt, head, last, budget, name, keep=name == "prefill",
                                            against=against)
            rec.constructions[name] = cont
            if name == "prefill":
                prefill_state = state
                rec.constructions["prefill:replica"], _ = self.construction(rec, "prefill", prompt, head, last, budget,
                                                                            "prefill:replica")
        return prefill_state

    def construction(self, rec: CellRecord, name: str, prompt: Sequence[int], ids: Sequence[int], last: int,
                     budget: int, path: str, keep: bool = False, against: Any = None) -> tuple[Continuation, Any]:
        """Build ``name``'s state over ``ids`` -> fingerprint -> continue from ``last`` -> extract the label."""
        self.dec.path = path
        state = self.dec.build_state(ids, schedule(name, len(prompt), len(ids)))
        if against is not None:
            rec.comparison.bridge_mismatch = [
                f"{c.layer}:{part}" for c in kv.compare(state, against)
                for part, same in (("k", c.keys_equal), ("v", c.values_equal)) if not same
            ]
        fp = kv.fingerprint(state)
        kept = kv.clone(state) if keep else None
        margins: list[float] = []
        suffix, lfp = continue_greedy(self.dec, state, last, budget, margins)
        # the label reads the generated part of the prefix this continuation extends
        return self.labelled(rec, suffix, fp, lfp, margins, list(ids[len(prompt):]) + [last]), kept

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
            rec.fixed = {
                "replay": self.construction(rec, "incremental", prompt, ids, last, budget, "fixed:replay")[0],
                "prefill": self.construction(rec, "prefill", prompt, ids, last, budget, "fixed:prefill")[0],
            }

    def anatomy(self, rec: CellRecord, live_state: Any, prefill_state: Any) -> None:
        if rec.unsupported is None:
            layers = kv.compare(live_state, prefill_state)
            rec.comparison.drift = [[c.layer, c.keys_max_abs, c.values_max_abs, c.keys_rel, c.values_rel]
                                    for c in layers]
            rec.comparison.differing_layers = [c.layer for c in layers if not (c.keys_equal and c.values_equal)]
            rec.comparison.identical_layers = [c.layer for c in layers if c.keys_equal and c.values_equal]
        live, prefill = rec.constructions["live"].suffix, rec.constructions["prefill"].suffix
        if live != prefill:
            j = next((i for i, (a, b) in enumerate(zip(live, prefill)) if a != b), None)
            if j is not None:
                rec.comparison.divergence_text = [self.decode([live[j]]), self.decode([prefill[j]])]

    def transplants(self, rec: CellRecord, live_state: Any, prefill_state: Any, last: int, budget: int,
                    sweep: bool) -> None:
        """Donor following, both directions: all layers, and on the first divergent items the sweep's subsets;
        then the controls, which must leave each receiver's suffix as it was: a sham (the receiver's own
        cache handed to the transplant as donor) and, where the two states share bit-identical layers, a
        transplant of only those layers."""
        subsets: list[tuple[tuple[int, ...] | None, str]] = [(None, "kv")]
        if sweep:
            subsets += sweep_subsets(len(kv.layer_kv(live_state)))
        states = {"live": live_state, "prefill": prefill_state}
        pairs = (("live", "prefill"), ("prefill", "live"))  # (donor, receiver)
        for layers, parts in subsets:
            for donor, receiver in pairs:
                self.transplant(rec, DONOR, states[receiver], states[donor], donor, receiver, layers, parts, last, budget)
        for name in ("prefill", "live"):
            # the same object as receiver and donor: the transplant path itself is what the sham tests
            self.transplant(rec, SHAM, states[name], states[name], name, name, None, "kv", last, budget)
        same = tuple(rec.comparison.identical_layers)
        if same:
            for donor, receiver in pairs:
                self.transplant(rec, IDENTICAL, states[receiver], states[donor], donor, receiver, same, "kv", last, budget)

    def transplant(self, rec: CellRecord, kind: str, receiver: Any, donor: Any, donor_name: str, receiver_name: str,
                   layers: tuple[int, ...] | None, parts: str, last: int, budget: int) -> None:
        """One transplant -> continue -> compare with the donor's and the receiver's own suffixes."""
        direction = f"{donor_name}_to_{receiver_name}"
        self.dec.path = f"transplant:{direction}" if kind == DONOR else (
            f"transplant:sham:{receiver_name}" if kind == SHAM else f"transplant:{kind}:{direction}")
        state = self.transplant_fn(receiver, donor, layers, parts)
        margins: list[float] = []
        suffix, _ = continue_greedy(self.dec, state, last, budget, margins)
        target, own = rec.constructions[donor_name].suffix, rec.constructions[receiver_name].suffix
        rec.transplants.append(Transplant(direction, layers, parts, suffix, suffix == target, kind, suffix == own,
                                          tuple(round(m, 6) for m in margins), self.decode(suffix)))
