"""The compute-once store: every (item, construction, precision) cell of a run, computed once.

A run's plan is fixed by its :class:`AuditConfig`. :meth:`Store.compute` walks precision by precision
(one model in memory at a time) and item by item, computes every cell that any claim reads, takes
fingerprints and suffixes, runs the transplants on divergent items while both boundary caches are in
hand, and frees the caches. Claims only read :attr:`Store.records`: plain data that pickles and
JSON-serialises, so xdist workers can ship their shard to the controller.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from . import cache as kv
from .chat import chat_prompt_ids
from .config import EMBEDDED_DIR, AuditConfig, BoundaryRule
from .constructions import Continuation, Cost, Decoder, continue_greedy, schedule, trajectory
from .errors import KvauditError, UnsupportedCacheError
from .items import Item, ItemSet, extract_answer, load_item_set
from .loading import ModelHandle, environment, open_model, resolve_checkpoint

Progress = Callable[[int, int, int, float], None]  # done, total, tokens, seconds


@dataclass
class Transplant:
    direction: str  # "live_to_prefill" (live donor, prefill receiver) or "prefill_to_live"
    layers: tuple[int, ...] | None  # None = all layers
    parts: str  # "kv", "k" or "v"
    suffix: tuple[int, ...]
    followed: bool  # receiver's suffix equals the donor's, token for token


@dataclass
class CellRecord:
    """One item at one precision: the trajectory, every construction's continuation, the transplants."""

    item_id: str
    dtype: str
    prompt_ids: tuple[int, ...]
    generated: tuple[int, ...]
    boundary: int | None
    reason: str | None
    answer: str
    constructions: dict[str, Continuation] = field(default_factory=dict)
    # the fixed-prefix 2x2 at this precision with the primary precision's prefix ids
    fixed: dict[str, Continuation] = field(default_factory=dict)
    fixed_prefix_fp: str | None = None
    transplants: list[Transplant] = field(default_factory=list)
    #: layers whose K or V differ between the incremental replay and the live cache ("3:k", "3:v")
    bridge_mismatch: list[str] = field(default_factory=list)
    #: per layer [layer, K max-abs, V max-abs, K relative, V relative] between live and prefill states
    drift: list[list[float]] = field(default_factory=list)
    axes: dict[str, dict[str, Any]] = field(default_factory=dict)  # attention implementation -> outcome
    #: the decoded tokens where live and prefill first part, for people reading the anatomy
    divergence_text: list[str] = field(default_factory=list)
    batch: dict[str, Any] = field(default_factory=dict)  # batch invariance outcome
    unsupported: str | None = None  # why K/V operations do not apply to this model
    error: str | None = None  # an error on this item alone (out of memory), the run went on

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
            Transplant(**{**t, "suffix": tuple(t["suffix"]), "layers": None if t["layers"] is None else tuple(t["layers"])})
            for t in d["transplants"]
        ]
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


def shard(items: Sequence[Item], index: int, count: int) -> list[Item]:
    """Deterministic round-robin shard ``index`` of ``count``."""
    return [it for i, it in enumerate(items) if i % count == index]


class Store:
    """Holds the run's cells. ``compute()`` fills them once; claims read ``records``."""

    #: fault injection for self-tests (see Decoder); class-level so a conftest can set them
    logits_hook: Callable[[Any, str], Any] | None = None
    state_hook: Callable[[Any, str], None] | None = None

    def __init__(self, cfg: AuditConfig, item_set: ItemSet, shard_index: int = 0, shard_count: int = 1) -> None:
        self.cfg = cfg
        self.item_set = item_set
        self.items: list[Item] = shard(item_set.items, shard_index, shard_count)
        self.shard_index, self.shard_count = shard_index, shard_count
        self.records: dict[tuple[str, str], CellRecord] = {}
        self.cost = Cost()
        self.identity: dict[str, Any] = {}
        self.environment: dict[str, Any] = {}
        self.computed = False
        self.missing: list[str] = []  # items whose shard never arrived (a crashed xdist worker)
        self._handles: dict[str, ModelHandle] = {}
        self._index = {it.id: i for i, it in enumerate(item_set.items)}

    @staticmethod
    def resolve(cfg: AuditConfig) -> tuple[AuditConfig, ItemSet]:
        """The config with its item file resolved (the checkpoint's own by default), and the item set."""
        local = resolve_checkpoint(cfg.model, cfg.trust_remote_code)  # a missing checkpoint is named first
        if not cfg.items and (local / "items.jsonl").is_file():
            cfg = cfg.replace(items=str(local / "items.jsonl"))
        return cfg, load_item_set(cfg.items_path(), cfg.n, cfg.boundary, cfg.answer_regex, cfg.max_new_tokens)

    @classmethod
    def open(cls, cfg: AuditConfig, shard_index: int = 0, shard_count: int = 1) -> Store:
        cfg, item_set = cls.resolve(cfg)
        return cls(cfg, item_set, shard_index, shard_count)

    @classmethod
    def merged(cls, cfg: AuditConfig, item_set: ItemSet, exports: list[dict[str, Any]]) -> Store:
        """One store over the whole item set from shard exports, in the order a single process computes."""
        s = cls(cfg, item_set)
        found: dict[tuple[str, str], CellRecord] = {}
        for e in exports:
            for d in e["records"]:
                r = CellRecord.from_dict(d)
                found[(r.item_id, r.dtype)] = r
            for k in ("forward_calls", "forward_tokens", "minimal_forward_tokens"):
                setattr(s.cost, k, getattr(s.cost, k) + e["cost"][k])
            s.cost.seconds = max(s.cost.seconds, e["cost"]["seconds"])
            s.identity = s.identity or e["identity"]
            s.environment = s.environment or e["environment"]
        for dtype in cfg.dtypes:
            for item in item_set.items:
                if (item.id, dtype) in found:
                    s.records[(item.id, dtype)] = found[(item.id, dtype)]
        have = {i for i, _ in found}
        s.missing = [it.id for it in item_set.items if it.id not in have]
        s.computed = True
        return s

    # -- reading -------------------------------------------------------------------------------
    def record(self, item_id: str, dtype: str) -> CellRecord:
        self.compute()
        return self.records[(item_id, dtype)]

    def handle(self, dtype: str, attn: str | None = None) -> ModelHandle:
        """The model at ``dtype`` (and attention ``attn``, default the run's); one in memory at a time."""
        key = f"{dtype}/{attn or self.cfg.attn}"
        if key not in self._handles:
            self._handles.clear()
            _free_device_memory()
            c = self.cfg
            self._handles[key] = open_model(c.model, dtype, c.device, attn or c.attn, c.trust_remote_code, c.allow_pickle,
                                            c.device_map)
        return self._handles[key]

    # -- computing -----------------------------------------------------------------------------
    def prompt_ids(self, item: Item, h: ModelHandle) -> tuple[int, ...]:
        if item.prompt_ids is not None:
            return item.prompt_ids
        assert item.prompt is not None
        if self.cfg.chat_template:
            return chat_prompt_ids(h.tokenizer, item.prompt, self.cfg.model)
        return tuple(h.tokenizer(item.prompt, add_special_tokens=True)["input_ids"])

    def compute(self, progress: Progress | None = None) -> None:
        if self.computed:
            return
        t0 = time.perf_counter()
        total = len(self.items) * len(self.cfg.dtypes)
        done = 0
        fixed_prefix: dict[str, tuple[int, ...] | None] = {}
        donors_left = self.cfg.donor_max_units
        self._sweeps_left = self.cfg.sweep_units
        for dtype in self.cfg.dtypes:
            h = self.handle(dtype)
            if not self.identity:
                self.identity = dict(h.identity)
                if Path(self.cfg.model).resolve() == EMBEDDED_DIR.resolve():
                    self.identity["id"] = "embedded"
                self.environment = environment(h.device) | {"attn_implementation": h.attn_implementation}
            self.environment.setdefault("dtypes", []).append(dtype)
            self._check_markers(h)
            dec = Decoder(h.model, h.eos_ids, self.cost, type(self).logits_hook, type(self).state_hook)
            for item in self.items:
                rec = self._cell(dec, h, item, dtype, fixed_prefix, donors_left > 0)
                if any(t.layers is None and t.parts == "kv" for t in rec.transplants):
                    donors_left -= 1
                self.records[(item.id, dtype)] = rec
                done += 1
                if progress is not None:
                    progress(done, total, self.cost.forward_tokens, time.perf_counter() - t0)
            self._batch_invariance(dec, h, dtype)
            for attn in self.cfg.attn_axes:
                self._attention_axis(dtype, attn)
        self._handles.clear()
        gc.collect()
        self.cost.seconds = round(time.perf_counter() - t0, 3)
        self.computed = True

    def _cell(self, dec: Decoder, h: ModelHandle, item: Item, dtype: str,
              fixed_prefix: dict[str, tuple[int, ...] | None], donors: bool) -> CellRecord:
        try:
            return self._cell_inner(dec, h, item, dtype, fixed_prefix, donors)
        except KvauditError:
            raise
        except RuntimeError as exc:  # out of memory on one item: report it for that item and go on
            if "out of memory" not in str(exc).lower():
                raise
            _free_device_memory()
            return CellRecord(item.id, dtype, (), (), None, "error", item.answer, error=f"out of memory: {str(exc).splitlines()[0]}")

    def _cell_inner(self, dec: Decoder, h: ModelHandle, item: Item, dtype: str,
                    fixed_prefix: dict[str, tuple[int, ...] | None], donors: bool) -> CellRecord:
        cfg, iset = self.cfg, self.item_set
        rule = BoundaryRule.parse(item.boundary or iset.boundary)
        budget_total = iset.max_new_tokens
        prompt = self.prompt_ids(item, h)
        tok = h.tokenizer

        def decode(ids: Sequence[int]) -> str:
            return tok.decode(list(ids), skip_special_tokens=False)

        dec.path = "live"
        tr = trajectory(dec, prompt, budget_total, rule, decode, keep_state=True)
        rec = CellRecord(item.id, dtype, tr.prompt_ids, tr.generated, tr.boundary, tr.reason, item.answer)
        self.cost.minimal_forward_tokens += len(prompt) + max(0, len(tr.generated) - 1)
        if dtype == cfg.primary_dtype:
            fixed_prefix[item.id] = tr.prefix if tr.reason is None else None
        if tr.reason is not None:
            return rec

        prefix = tr.prefix
        head = list(prefix[:-1])
        last = prefix[-1]
        budget = budget_total - tr.boundary  # type: ignore[operator]

        def label_of(suffix: Sequence[int], gen_head: Sequence[int]) -> tuple[str | None, bool]:
            ans = extract_answer(decode(list(gen_head) + list(suffix)), iset.answer_regex)
            return ans, ans is not None and ans == item.answer

        def cont(fp: str, suffix: tuple[int, ...], lfp: str, margins: Sequence[float] = (),
                 gen_head: Sequence[int] | None = None) -> Continuation:
            # the generated part of the prefix this continuation extends (another precision's, in the 2x2)
            ans, ok = label_of(suffix, tr.generated[: tr.boundary] if gen_head is None else gen_head)
            return Continuation(suffix, fp, lfp, ans, ok, tuple(round(m, 6) for m in margins))

        def run(construction: str, ids: Sequence[int], path: str, keep: bool = False,
                last: int = last, budget: int = budget, against: Any = None) -> tuple[Continuation, Any]:
            """Build ``construction``'s state over ``ids`` (= prefix[:-1]), then continue from ``last``."""
            dec.path = path
            state = dec.build_state(ids, schedule(construction, len(prompt), len(ids)))
            if against is not None and rec.unsupported is None:
                rec.bridge_mismatch = [
                    f"{c.layer}:{part}"
                    for c in kv.compare(state, against)
                    for part, same in (("k", c.keys_equal), ("v", c.values_equal))
                    if not same
                ]
            fp = kv.fingerprint(state)
            kept = kv.clone(state) if keep else None
            margins: list[float] = []
            suffix, lfp = continue_greedy(dec, state, last, budget, margins)
            self.cost.minimal_forward_tokens += len(ids) + len(suffix)
            return cont(fp, suffix, lfp, margins, list(ids[len(prompt):]) + [last]), kept

        try:
            kv.check_plain_kv(tr.state)
        except UnsupportedCacheError as exc:
            rec.unsupported = str(exc)
        live = cont(tr.state_fp or "", tr.suffix, tr.logits_fp or "", tr.margins)
        rec.constructions["live"] = live
        # the replica regenerates the whole trajectory: the same construction computed a second time
        dec.path = "live:replica"
        rep = trajectory(dec, prompt, budget_total, rule, decode)
        self.cost.minimal_forward_tokens += len(prompt) + max(0, len(rep.generated) - 1)
        if rep.boundary == tr.boundary and rep.reason is None:
            rec.constructions["live:replica"] = cont(rep.state_fp or "", rep.suffix, rep.logits_fp or "")
        else:
            rec.constructions["live:replica"] = Continuation(rep.generated, rep.state_fp or "", "", None, False)
        prefill, prefill_state = run("prefill", head, "prefill", keep=True)
        rec.constructions["prefill"] = prefill
        if rec.unsupported is None:  # how far the two boundary states are apart, layer by layer
            rec.drift = [[c.layer, c.keys_max_abs, c.values_max_abs, c.keys_rel, c.values_rel]
                         for c in kv.compare(tr.state, prefill_state)]
        rec.constructions["prefill:replica"], _ = run("prefill", head, "prefill:replica")
        rec.constructions["incremental"], _ = run("incremental", head, "incremental", against=tr.state)
        for c in cfg.chunks:
            rec.constructions[f"chunked({c})"], _ = run(f"chunked({c})", head, f"chunked({c})")

        # fixed-prefix 2x2: this precision on the primary precision's prefix ids
        fp_ids = fixed_prefix.get(item.id)
        if fp_ids is not None:
            rec.fixed_prefix_fp = kv.fingerprint_ids(fp_ids)
            if fp_ids == prefix:
                rec.fixed = {"replay": rec.constructions["incremental"], "prefill": prefill}
            else:
                fb = budget_total - (len(fp_ids) - len(prompt))
                if fb > 0:
                    rec.fixed = {
                        "replay": run("incremental", fp_ids[:-1], "fixed:replay", last=fp_ids[-1], budget=fb)[0],
                        "prefill": run("prefill", fp_ids[:-1], "fixed:prefill", last=fp_ids[-1], budget=fb)[0],
                    }

        if live.suffix != prefill.suffix:
            j = next((i for i, (a, b) in enumerate(zip(live.suffix, prefill.suffix)) if a != b), None)
            if j is not None:
                rec.divergence_text = [decode([live.suffix[j]]), decode([prefill.suffix[j]])]
        if donors and rec.unsupported is None and live.suffix != prefill.suffix:
            self._transplants(dec, rec, tr.state, prefill_state, last, budget, live, prefill, self._sweeps_left > 0)
            self._sweeps_left -= 1
        return rec  # the boundary caches go with this frame: only fingerprints and suffixes stay

    def _transplants(self, dec: Decoder, rec: CellRecord, live_state: Any, prefill_state: Any, last: int,
                     budget: int, live: Continuation, prefill: Continuation, sweep: bool) -> None:
        """Donor following, both directions: the receiver continues from the donor's K/V (all layers,
        and on the first divergent items the layer sweep's subsets)."""
        subsets: list[tuple[tuple[int, ...] | None, str]] = [(None, "kv")]
        if sweep:
            subsets += sweep_subsets(len(kv.layer_kv(live_state)))
        for layers, parts in subsets:
            for direction, receiver, donor, target in (
                ("live_to_prefill", prefill_state, live_state, live),
                ("prefill_to_live", live_state, prefill_state, prefill),
            ):
                dec.path = f"transplant:{direction}"
                state = self.transplant_fn(receiver, donor, layers, parts)
                suffix, _ = continue_greedy(dec, state, last, budget)
                self.cost.minimal_forward_tokens += len(suffix)
                rec.transplants.append(Transplant(direction, layers, parts, suffix, suffix == target.suffix))

    #: the transplant operation; self-tests swap in one that copies nothing to prove the claim can fail
    transplant_fn = staticmethod(kv.transplant)

    def _check_markers(self, h: ModelHandle) -> None:
        """A boundary marker the tokenizer cannot even spell would make every item silently ineligible."""
        rules = {item.boundary or self.item_set.boundary for item in self.items}
        for text in sorted(rules):
            rule = BoundaryRule.parse(text)
            if rule.marker is None:
                continue
            ids = h.tokenizer(rule.marker, add_special_tokens=False)["input_ids"]
            back = h.tokenizer.decode(ids, skip_special_tokens=False)
            if rule.marker not in back:
                raise KvauditError(
                    f"boundary marker {rule.marker!r} cannot be produced by the tokenizer of {self.cfg.model} "
                    f"(it decodes back as {back!r}): pass --kvaudit-boundary with a marker it can spell, or tokens:K"
                )

    def _attention_axis(self, dtype: str, attn: str) -> None:
        """Another attention implementation on the same items: is its live cache the same as its prefill?"""
        h = self.handle(dtype, attn)
        dec = Decoder(h.model, h.eos_ids, self.cost, type(self).logits_hook, type(self).state_hook)
        for item in self.items:
            rec = self.records[(item.id, dtype)]
            if not rec.eligible or rec.unsupported:
                continue
            rule = BoundaryRule.parse(item.boundary or self.item_set.boundary)
            dec.path = f"axis:{attn}:live"
            tr = trajectory(dec, rec.prompt_ids, self.item_set.max_new_tokens, rule,
                            lambda ids: h.tokenizer.decode(list(ids), skip_special_tokens=False))
            self.cost.minimal_forward_tokens += len(rec.prompt_ids) + max(0, len(tr.generated) - 1)
            if tr.reason is not None:
                rec.axes[attn] = {"eligible": False, "reason": tr.reason}
                continue
            # this implementation's own trajectory fixes its prefix: live vs prefill under ``attn``
            head = list(tr.prefix[:-1])
            dec.path = f"axis:{attn}:prefill"
            state = dec.build_state(head, [len(head)])
            fp = kv.fingerprint(state)
            suffix, _ = continue_greedy(dec, state, tr.prefix[-1], self.item_set.max_new_tokens - (tr.boundary or 0))
            self.cost.minimal_forward_tokens += len(head) + len(suffix)
            rec.axes[attn] = {"eligible": True, "state_equal": fp == tr.state_fp, "suffix_equal": suffix == tr.suffix,
                              "same_trajectory_as_primary": tr.generated == rec.generated}

    def _batch_invariance(self, dec: Decoder, h: ModelHandle, dtype: str) -> None:
        """The item's boundary state computed alone vs as one row of a left-padded batch of others."""
        import torch

        b = self.cfg.batch_size
        for item in self.items:
            rec = self.records[(item.id, dtype)]
            if self._index[item.id] >= self.cfg.batch_units or not rec.eligible or rec.unsupported or b < 2:
                continue
            head = list(rec.prefix[:-1])
            others = [self.item_set.items[(self._index[item.id] + j) % len(self.item_set.items)] for j in range(1, b)]
            rows = [head] + [list(self.prompt_ids(o, h)) for o in others]
            width = max(len(r) for r in rows)
            pad = h.tokenizer.pad_token_id if h.tokenizer.pad_token_id is not None else 0
            ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=dec.device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=dec.device)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = dec.fresh()
            try:
                with torch.no_grad():
                    h.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                            **{kv.cache_kwarg(h.model): cache})
                dec.cost.forward_calls += 1
                dec.cost.forward_tokens += int(ids.numel())
                self.cost.minimal_forward_tokens += int(ids.numel())
                off = width - len(head)
                mine = [t[0:1, :, off:, :] for k_v in kv.layer_kv(cache) for t in k_v]
                same = kv.fingerprint_tensors(mine, tag=b"kv") == rec.constructions["prefill"].state_fp
                rec.batch = {"batch_size": b, "state_equal": same}
            except (RuntimeError, ValueError, IndexError) as exc:  # a cache layout without a batch of rows
                rec.batch = {"batch_size": b, "error": str(exc).splitlines()[0][:200]}

    # -- plain data for xdist and the ledger ----------------------------------------------------
    def export(self) -> dict[str, Any]:
        return {
            "shard": [self.shard_index, self.shard_count],
            "records": [r.to_dict() for r in self.records.values()],
            "cost": asdict(self.cost),
            "identity": self.identity,
            "environment": self.environment,
        }


def _free_device_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass
