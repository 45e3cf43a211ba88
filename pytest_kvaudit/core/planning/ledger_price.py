"""The run priced on a recorded ledger's lengths (:func:`ledger_prediction`): in the environment that recorded
it a run reproduces every trajectory bit for bit, so the plan can state the forward tokens exactly."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.compute.probes import batch_tokens
from pytest_kvaudit.core.cost import ledger as L
from pytest_kvaudit.core.cost.pricing import Lengths, price_units, units_of_ledger
from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.config import AuditConfig
from pytest_kvaudit.core.model.pipeline import constructions
from pytest_kvaudit.core.planning.unit_work import transplants_per_unit, work


def ledger_prediction(cfg: AuditConfig, path: Path | None, identity: Mapping[str, Any], env: Mapping[str, Any],
                      prompts: Mapping[str, int | None], n_layers: int) -> dict[str, Any]:
    """The run priced on the lengths of its recorded ledger (the ledger claim's snapshot), when
    one was recorded for this model and these settings. In the environment that recorded it a run
    reproduces every trajectory bit for bit (what ``ledger_audit`` asserts), so the price is the run's
    forward tokens exactly; ``usable`` says whether it applies and ``why`` when not."""
    out: dict[str, Any] = {"path": str(path), "usable": False}
    if path is None or not path.is_file():
        return out | {"why": f"no ledger recorded at {path}"}
    try:
        doc = L.read(path)
    except KvauditError as exc:
        return out | {"why": str(exc)}
    current = {"model": dict(identity), "environment": dict(env),  # cfg.stop_regex: the item set's, resolved
               "config": {"stop_regex": cfg.stop_regex, "boundary": doc["config"].get("boundary"),
                          "max_new_tokens": doc["config"].get("max_new_tokens"),
                          "answer_regex": doc["config"].get("answer_regex"), "dtypes": list(cfg.dtypes),
                          "exact_items": cfg.exact_items}}
    diffs = L.identity_differences(doc, current, tokens_only=True)
    if diffs:
        return out | {"why": f"the ledger at {path} was recorded for another model or settings: {'; '.join(diffs)}"}
    held = {k for u in doc.get("units", {}).values() for k in (u.get("constructions") or {})}
    lacking = [s.name for s in constructions(cfg) if s.name not in held]
    if doc.get("units") and lacking:  # e.g. another engine's ledger: what this run computes there was not run
        return out | {"why": f"the ledger at {path} holds no {', '.join(lacking)}, which this run computes"}
    order = [i for i, p in prompts.items() if p is not None]
    units, guessed = units_of_ledger(doc, {i: int(prompts[i] or 0) for i in order}, cfg,
                                     lambda swept: transplants_per_unit(cfg, swept, n_layers))
    lengths = list(prompts.values())
    index = {i: k for k, i in enumerate(prompts)}
    steps: dict[str, dict[str, list[int]]] = {}
    priced = cfg.engine.price_under(cfg.engine_args)
    for d in cfg.dtypes:
        mine = [(i, units[(i, d)]) for i in order if (i, d) in units]
        acc = price_units([u for _, u in mine], priced, doc["config"].get("max_new_tokens"))
        batch = [t for i, u in mine if u.head is not None and (t := batch_tokens(u.head, index[i], lengths, cfg))]
        if batch:  # one forward of the padded batch each
            acc["batch_invariance"] = [len(batch), len(batch), sum(batch)]
        for _, u in mine:  # the axes run their own trajectories: priced on this precision's lengths
            if u.head is not None and (cfg.attn_axes or cfg.cache_axes):
                x = Lengths(u.prompt, u.head - u.prompt + 1, dict(u.continuations).get("prefill", 0))
                extra = work(x, cfg.replace(chunks=()), None, False, False, n_layers)
                for k, a in extra.items():
                    if k.startswith(("axis:", "cache:")):
                        acc[k] = [v + w for v, w in zip(acc.get(k, [0, 0, 0]), a)]
        steps[d] = acc
    missing = [i for i in order if any((i, d) not in units for d in cfg.dtypes)]
    env_diffs = [x for x in L.identity_differences(doc, current, tokens_only=False) if x.startswith("environment.")]
    # a request-level engine's requests are priced by its model (a ledger holds lengths, not the cached tokens)
    exact = (not missing and not guessed and not env_diffs and not cfg.attn_axes and not cfg.cache_axes
             and cfg.engine.request_price is None)
    return out | {"usable": not missing, "exact": exact, "steps": steps, "items_not_recorded": len(missing),
                  "rows": recorded_rows(doc, order, prompts, cfg.dtypes),
                  "transplant_units_priced_by_model": guessed, "environment_differences": env_diffs,
                  "why": None if not missing
                  else f"{len(missing)} of {len(order)} items are not in the ledger at {path}"}


def recorded_rows(doc: Mapping[str, Any], order: Sequence[str], prompts: Mapping[str, int | None],
                  dtypes: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Per precision, the ledger's units of the run's items as the calibration's rows (lengths, eligibility,
    divergence and both labels): every item of the run where the calibration sees its first few, so the rates a
    strict gate is planned on (and whether labels can move at all) come from the whole set."""
    out: dict[str, list[dict[str, Any]]] = {}
    for d in dtypes:
        rows = []
        for item in order:
            u = doc.get("units", {}).get(f"{item}@{d}")
            if u is None:
                continue
            cs = u.get("constructions") or {}
            live, pre = cs.get("live") or {}, cs.get("prefill") or {}
            ok = u.get("reason") is None and bool(live) and bool(pre)
            gen = len(str(u.get("generated") or "").split())
            rows.append({"prompt": int(prompts[item] or 0), "boundary": int(u.get("boundary") or 0), "generated": gen,
                         "eligible": ok, "divergent": ok and live.get("suffix") != pre.get("suffix"),
                         "suffix": len(str(live.get("suffix") or "").split()) if ok else 0,
                         "right": [bool(live.get("label")), bool(pre.get("label"))] if ok else None})
        out[d] = rows
    return out
