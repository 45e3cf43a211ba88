"""The compute-once store: every (item, construction, precision) cell of a run, computed once.

A run's plan is fixed by its :class:`AuditConfig`. :meth:`Store.compute` walks precision by precision
(one model in memory at a time) and item by item, hands each item to a :class:`~.cells.CellBuilder`,
then runs the per-precision probes. Claims only read :attr:`Store.records`: plain data that pickles and
JSON-serialises, so xdist workers can ship their shard to the controller.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.compute import probes
from pytest_kvaudit.core.compute.cells import prompt_ids
from pytest_kvaudit.core.compute.grants import LostItem, WorkSource, within
from pytest_kvaudit.core.compute.progress import Progress, Tally
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import EMBEDDED_DIR, AuditConfig
from pytest_kvaudit.core.model.engine_protocol import Backend, CellBuilding, OpenSpec
from pytest_kvaudit.core.model.items import Item, ItemSet, stopper
from pytest_kvaudit.core.model.records import CellRecord
from pytest_kvaudit.core.runtime.decoder import NO_FAULTS, Cost, Decoder, Faults
from pytest_kvaudit.core.runtime.environment import environment
from pytest_kvaudit.core.runtime.itemcheck import check_markers, check_prompt_ids, resolve


def open_spec(c: AuditConfig, dtype: str, attn: str | None = None) -> OpenSpec:
    """How run ``c`` opens its model at ``dtype`` (and attention ``attn``, default the run's)."""
    return OpenSpec(c.model, dtype, c.device, attn or c.attn, c.trust_remote_code, c.allow_pickle, c.device_map,
                    dict(c.engine_args))


def shard_items(items: Sequence[Item], index: int, count: int) -> list[Item]:
    """Deterministic round-robin shard ``index`` of ``count``."""
    return [it for i, it in enumerate(items) if i % count == index]


class Store:
    """Holds the run's cells. ``compute()`` fills them once; claims read ``records``."""

    def __init__(self, cfg: AuditConfig, item_set: ItemSet, faults: Faults = NO_FAULTS,
                 shard: tuple[int, int] = (0, 1)) -> None:
        self.cfg = cfg
        self.item_set = item_set
        # a runner's shard (--kvaudit-shard=I/N); xdist workers take its items from a queue (compute)
        self.items: list[Item] = shard_items(item_set.items, *shard)
        self.shard = shard
        self.faults = faults
        self.records: dict[tuple[str, str], CellRecord] = {}
        self.cost = Cost()
        self.identity: dict[str, Any] = {}
        self.environment: dict[str, Any] = {}
        self.computed = False
        self.missing: list[str] = []  # items whose shard never arrived (a crashed xdist worker)
        self.stages: dict[str, float] = {}  # seconds per precision: model load, its cells and probes
        #: what the run intended, priced before it ran (:mod:`pytest_kvaudit.core.planning.plan`)
        self.plan: dict[str, Any] = {}
        self._handles: dict[str, Backend] = {}

    @classmethod
    def open(cls, cfg: AuditConfig, faults: Faults = NO_FAULTS, shard: tuple[int, int] = (0, 1)) -> Store:
        cfg, item_set = resolve(cfg)
        return cls(cfg, item_set, faults, shard)

    # -- reading -------------------------------------------------------------------------------
    def record(self, item_id: str, dtype: str) -> CellRecord:
        self.compute()
        return self.records[(item_id, dtype)]

    def handle(self, dtype: str, attn: str | None = None) -> Backend:
        """The model at ``dtype`` (and attention ``attn``, default the run's); one in memory at a time."""
        key = f"{dtype}/{attn or self.cfg.attn}"
        if key not in self._handles:
            for held in self._handles.values():  # an engine that holds process-wide state lets it go now
                close = getattr(held, "close", None)
                if callable(close):
                    close()
            self._handles.clear()
            _free_device_memory()
            self._handles[key] = self.cfg.engine.opener(open_spec(self.cfg, dtype, attn))
        return self._handles[key]

    def prompt_ids(self, item: Item, h: Backend) -> tuple[int, ...]:
        return prompt_ids(item, h.tokenizer, self.cfg.chat_template, self.cfg.model)

    # -- computing -----------------------------------------------------------------------------
    def compute(self, progress: Progress | None = None, queue: WorkSource | None = None,
                nominal: int | None = None) -> None:
        """Every cell of this store's items, precision by precision (one model in memory at a time).

        With a ``queue`` (xdist workers), the items are taken one at a time from the queue shared with the
        other workers instead of all computed here; ``nominal`` is this worker's expected count, for progress.
        """
        if self.computed:
            return
        t0 = time.perf_counter()
        tally = Tally(list(self.cfg.dtypes), len(self.items) if nominal is None else nominal)
        if progress is not None:
            progress(tally)  # the shard's size, before the first model loads
        fixed_prefix: dict[str, tuple[int, ...] | None] = {}
        budgets = (self.cfg.donor_max_units, self.cfg.sweep_units)
        granted = 0  # transplant units so far, in (precision, item) order (a single process)
        for phase, dtype in enumerate(self.cfg.dtypes):
            t_stage = time.perf_counter()
            h = self.handle(dtype)
            learn_engine(self, h, dtype)
            check_markers(self.items, self.item_set, h.tokenizer, self.cfg.model)
            check_prompt_ids(self.item_set, h.vocab_size, self.cfg.model)
            dec = Decoder(h, h.eos_ids, self.cost, self.faults)
            builder = self.cfg.engine.cell_builder(dec, h.tokenizer, self.cfg, self.item_set, self.faults.transplant,
                                                   h.max_positions)
            dec.stop = stopper(self.item_set, builder.decode)
            for j, item in taken(self.items, phase, queue):
                # the budgets go to the first transplant units in (precision, item) order; under xdist counted
                # over every worker's units, decided (for a divergent unit only) once those before it are known
                grant = partial(within, granted, budgets) if queue is None else partial(queue.grant, phase, j, budgets)
                if queue is not None and phase > 0:
                    try:
                        fixed_prefix[item.id] = queue.prefix(j)
                    except LostItem:  # its first cell died with another worker: missing, not computed
                        continue
                rec = self._cell(builder, item, dtype, fixed_prefix, grant)
                granted += bool(rec.whole_transplants())
                self.records[(item.id, dtype)] = rec
                if queue is not None:
                    queue.done(phase, j, bool(rec.whole_transplants()), fixed_prefix.get(item.id) if phase == 0
                               else None)
                tally.done[dtype] = tally.done.get(dtype, 0) + 1
                tally.tokens, tally.seconds = self.cost.forward_tokens, time.perf_counter() - t0
                if progress is not None:
                    progress(tally)
            probe(self, dec, h, dtype)
            # one model resident at a time: these hold the model, and the next handle() can free only what
            # nothing else references (else two are in memory while the next one loads)
            if builder.layer_kinds and "layer_kinds" not in self.identity:  # the report names each layer's kind
                self.identity["layer_kinds"] = builder.layer_kinds
            del h, dec, builder
            for attn in self.cfg.attn_axes:
                probes.attention_axis(self, dtype, attn)
            self.stages[dtype] = round(time.perf_counter() - t_stage, 3)
        self._handles.clear()
        gc.collect()
        self.cost.seconds = round(time.perf_counter() - t0, 3)
        self.computed = True
        if progress is not None:  # the last word, never throttled: a queue worker cannot count to its end
            tally.finished, tally.seconds = True, self.cost.seconds
            progress(tally)

    def _cell(self, builder: CellBuilding, item: Item, dtype: str, fixed_prefix: dict[str, tuple[int, ...] | None],
              grant: Callable[[], tuple[bool, ...]]) -> CellRecord:
        """One cell; out of memory on one item is reported for that item and the run goes on."""
        try:
            rec, prefix = builder.compute(item, dtype, fixed_prefix.get(item.id), grant)
        except KvauditError:
            raise
        except RuntimeError as exc:
            if "out of memory" not in str(exc).lower():
                raise
            _free_device_memory()
            rec, prefix = CellRecord(item.id, dtype, (), (), None, "error", item.answer,
                                     error=f"out of memory: {str(exc).splitlines()[0]}"), None
        if dtype == self.cfg.primary_dtype:
            fixed_prefix[item.id] = prefix
        return rec

    # -- plain data for xdist and the ledger ----------------------------------------------------
    def export(self) -> dict[str, Any]:
        return {
            "shard": list(self.shard),
            "records": [r.to_dict() for r in self.records.values()],
            "cost": asdict(self.cost),
            "identity": self.identity,
            "environment": self.environment,
            "stages": self.stages,
            "plan": self.plan,
        }


def learn_engine(store: Store, h: Backend, dtype: str) -> None:
    """The model's identity and the environment, from the first precision's engine; each engine's own facts
    (per precision where keyed)."""
    if not store.identity:
        store.identity = dict(h.identity)
        if Path(store.cfg.model).resolve() == EMBEDDED_DIR.resolve():
            store.identity["id"] = "embedded"
        store.environment = environment(h.device) | {"attn_implementation": h.attn_implementation,
                                                     "backend": store.cfg.backend}  # the name, as data
    store.environment.setdefault("dtypes", []).append(dtype)
    for key, value in getattr(h, "environment", {}).items():
        if isinstance(value, dict):
            store.environment.setdefault(key, {}).update(value)
        else:
            store.environment.setdefault(key, value)


def probe(store: Store, dec: Decoder, h: Backend, dtype: str) -> None:
    """The probes on the precision's loaded model: batch invariance, then the cache axes (before the attention
    axes, which load other models)."""
    probes.batch_invariance(store, dec, h, dtype)
    for kind in store.cfg.cache_axes:
        store.cfg.engine.cache_probe(store, h, dtype, kind)


def taken(items: Sequence[Item], phase: int, queue: WorkSource | None) -> Iterator[tuple[int, Item]]:
    """(index, item) in item order: all of a store's items, or those this worker takes from the queue."""
    if queue is None:
        yield from enumerate(items)
        return
    while (j := queue.take(phase)) is not None:
        yield j, items[j]


def _free_device_memory() -> None:
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:
        pass
