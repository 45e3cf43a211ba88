"""What the audit refuses, with the reason: checkpoint files that are damaged, and models it cannot judge.

Each check is one line naming the file or model and the fix, raised before (files) or right after
(weights, vocabulary, causality) ``from_pretrained``, so that nothing is ever judged on a model that loaded
half its weights or sees the future.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError


def read_json(path: Path, fix: str) -> Any:
    """A checkpoint's JSON file, or one line naming the file, what is wrong and ``fix``."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise KvauditError(f"{path}: not UTF-8 text (byte {exc.start}); {fix}") from None
    except OSError as exc:
        raise KvauditError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__}); {fix}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise KvauditError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); {fix}") from None
    except RecursionError:
        raise KvauditError(f"{path}: JSON nested too deeply; {fix}") from None


#: the JSON files of a checkpoint that transformers reads, checked before it reads them (its own errors
#: for these are tracebacks from inside the tokenizers library)
CHECKPOINT_JSON = ("generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.json", "preprocessor_config.json")


def check_files(path: Path) -> None:
    """Every JSON file the loaders read parses, and no safetensors file is cut short."""
    for name in CHECKPOINT_JSON:
        if (path / name).is_file():
            read_json(path / name, "restore it from the original checkpoint")
    for f in sorted(path.glob("*.safetensors.index.json")):
        read_json(f, "restore it from the original checkpoint")
    for f in sorted(path.glob("*.safetensors")):
        check_safetensors(f)


def check_safetensors(f: Path) -> None:
    """A safetensors file holds an 8-byte header length, a JSON header and the tensors' bytes; a download
    cut short lacks some of them, which safetensors reports as a traceback deep inside from_pretrained."""
    fix = "re-download or re-save the checkpoint"
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise KvauditError(f"{f} is truncated or not a safetensors file ({size} bytes, header unreadable); {fix}")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError, IndexError, AttributeError):
        raise KvauditError(f"{f}: the safetensors header is corrupt; {fix}") from None
    if 8 + n + end > size:
        raise KvauditError(f"{f} is truncated: {size} bytes, its header needs {8 + n + end}; {fix}")


def _ignored(model: Any, attr: str) -> list[str]:
    """Key patterns transformers itself ignores when loading (tied weights, buffers it recomputes)."""
    pats = getattr(model, attr, None) or []
    tied = getattr(model, "_tied_weights_keys", None) or []
    return [*pats, *(tied.keys() if isinstance(tied, dict) else tied)] if attr.endswith("missing") else list(pats)


def check_loading_info(path: Path, model: Any, info: dict[str, Any]) -> None:
    """Refuse weights missing (initialised at random), unexpected (unused: a config edited to fewer layers)
    or of the wrong shape: the audit would judge a model that is not the checkpoint."""

    def keep(keys: Any, attr: str) -> list[str]:
        pats = _ignored(model, attr)
        return sorted(k for k in keys if not any(re.search(p, k) for p in pats))

    missing = keep(info.get("missing_keys") or (), "_keys_to_ignore_on_load_missing")
    if missing:
        raise KvauditError(
            f"checkpoint {path} lacks {len(missing)} weight(s) that config.json asks for, e.g. {missing[0]} "
            "(transformers would fill them at random): restore the missing weights or use the matching config.json"
        )
    mismatched = sorted(info.get("mismatched_keys") or (), key=str)
    if mismatched:
        first = mismatched[0]
        what = (f"{first[0]} is {tuple(first[1])} in the weights, {tuple(first[2])} by config.json"
                if isinstance(first, (tuple, list)) and len(first) == 3 else str(first))
        raise KvauditError(
            f"weights of {path} do not fit its config.json ({len(mismatched)} shape mismatch(es): {what}): "
            "they come from different checkpoints"
        )
    unexpected = keep(info.get("unexpected_keys") or (), "_keys_to_ignore_on_load_unexpected")
    if unexpected:
        raise KvauditError(
            f"checkpoint {path} holds {len(unexpected)} weight(s) its config.json does not use, e.g. {unexpected[0]}: "
            "the config and the weights do not match (a config edited to fewer layers?); use the checkpoint's own "
            "config.json"
        )


#: how far (in the model dtype's epsilons, relative to the logits' scale) earlier positions may move when
#: the last token changes before the model counts as not causal; see :func:`check_causal`
CAUSAL_NOISE_EPS = 16
#: a nondeterministic model is refused only where earlier positions move by more than this many times the
#: largest run-to-run difference of the same ids; see :func:`check_causal`
CAUSAL_SPREAD_MARGIN = 4.0
#: how many times the same ids run, to measure that spread (each a pair with the first run)
CAUSAL_REPEATS = 3


def _same_bits(a: Any, b: Any) -> bool:
    import torch

    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _max_abs(a: Any, b: Any) -> float:
    """The largest difference; 0.0 for identical bits (NaN in both places is no difference)."""
    return 0.0 if _same_bits(a, b) else float((a.float() - b.float()).abs().max())


def check_causal(model: Any, path: Path) -> float:
    """Refuse a model whose earlier positions see later tokens (a bidirectional encoder); return the
    run-to-run spread of its logits (0.0: the same ids give the same bits).

    Change the last token of a short sequence: a causal model's logits at every earlier position stay
    bit-identical. Not all do bit for bit: a mixture-of-experts layer multiplies each expert's tokens as
    one matrix, and the changed token's routing changes those matrices' shapes and so the rounding of the
    others (a tiny Qwen2-MoE in fp32 on CPU moves by 7e-9). So when the bits differ, the model is refused
    only if earlier positions move by more than rounding could: ``CAUSAL_NOISE_EPS`` epsilons of the
    model's dtype, relative to the logits' scale. An encoder's earlier positions move by far more (a
    random-weight BERT in fp32: 2e-3 of the scale against a bound of 2e-6). In bf16 the bound is 1/8 of
    the scale: a weakly bidirectional model passes there, and is refused by the fp32 load of the same run.

    Nondeterminism is a finding, not a refusal: the same ids run ``CAUSAL_REPEATS`` times first, and where
    those runs differ (nondeterministic kernels), changing the last token is judged against that spread:
    refused only when earlier positions move by more than ``CAUSAL_SPREAD_MARGIN`` times the largest
    run-to-run difference (plus rounding). Pure noise moves them by the spread's own size (the same
    distribution); an encoder's leak is orders of magnitude above it, and a leak within the noise cannot
    be told from it, so it is not refused. The run goes on and its replicas show the nondeterminism.
    """
    import torch

    vocab = int(model.get_input_embeddings().weight.shape[0])
    if vocab < 2:
        return 0.0
    n = 6
    ids = torch.tensor([[(3 + 5 * i) % vocab for i in range(n)]], device=model.device)
    other = ids.clone()
    other[0, -1] = (int(ids[0, -1]) + 1) % vocab
    with torch.no_grad():
        runs = [model(input_ids=ids, use_cache=False).logits[:, :-1] for _ in range(CAUSAL_REPEATS)]
        b = model(input_ids=other, use_cache=False).logits[:, :-1]
    a = runs[0]
    spread = max(_max_abs(a, r) for r in runs[1:])
    if _same_bits(a, b):
        return spread
    moved = _max_abs(a, b)
    dtype = getattr(model, "dtype", a.dtype)
    eps = float(torch.finfo(dtype if dtype.is_floating_point else a.dtype).eps)
    bound = CAUSAL_NOISE_EPS * eps * max(float(a.float().abs().max()), 1e-30)
    allowed = CAUSAL_SPREAD_MARGIN * spread + bound
    if not moved <= allowed:  # NaN moves too
        why = (f"the same ids run twice differ by up to {spread:.3g}, so it is nondeterministic, and "
               f"{CAUSAL_SPREAD_MARGIN:g}x that plus rounding allows {allowed:.3g}" if spread
               else f"rounding allows {bound:.3g}")
        raise KvauditError(
            f"checkpoint {path} ({type(model).__name__}) is not causal: changing the last token moved the logits "
            f"at earlier positions by {moved:.3g} ({why}), so a prefix's state depends on what "
            "follows it; kvaudit audits causal decoder LMs only (a BERT-like encoder needs is_decoder=true)"
        )
    return spread


def check_vocab(model: Any, tokenizer: Any, path: Path) -> None:
    n_model = model.get_input_embeddings().weight.shape[0]
    n_tok = len(tokenizer)
    if n_tok > n_model:
        raise KvauditError(
            f"tokenizer of {path} has {n_tok} tokens but the model's embedding has {n_model}: "
            "they come from different checkpoints"
        )


def ready(where: Path, model: Any, info: Any, device: str, device_map: str | None) -> Any:
    """A model transformers just loaded (a checkpoint folder or a GGUF file, ``where``): refused where its loading
    info names weights it lacks or ignores, then placed on ``device`` (unless a device map placed it) and frozen."""
    check_loading_info(where, model, info)
    if not device_map:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model
