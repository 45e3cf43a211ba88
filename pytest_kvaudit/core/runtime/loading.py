"""Checkpoint + tokenizer -> a model handle with its identity, dtype, device and attention.

Safe by default: only safetensors weights are read and ``trust_remote_code`` stays off unless the
user opts in (``--kvaudit-allow-pickle``, ``--kvaudit-trust-remote-code``). Every failure is one
line naming the checkpoint and the fix.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.engine_protocol import OpenSpec
from pytest_kvaudit.core.runtime import gguf
from pytest_kvaudit.core.runtime.environment import check_dtype_supported, environment, resolve_device, torch_dtype
from pytest_kvaudit.core.runtime.refusals import check_causal, check_files, check_vocab, read_json, ready

__all__ = ["ModelHandle", "check_dtype_supported", "environment", "model_identity", "open_model", "resolve_checkpoint",
           "resolve_device"]

_DIGESTS: dict[tuple[str, int, int], str] = {}


@dataclass
class ModelHandle:
    """One checkpoint loaded at one precision on one device."""

    model: Any
    tokenizer: Any
    dtype: str
    device: str
    attn_implementation: str
    identity: dict[str, Any]
    eos_ids: frozenset[int] = field(default_factory=frozenset)
    vocab_size: int = 0  # rows of the input embedding: prompt ids must be below it
    max_positions: int | None = None  # prompt + generation longer than this is ineligible (too_long)


def resolve_checkpoint(spec: str, trust_remote_code: bool = False) -> Path:
    """A local directory for ``spec`` (a path, or a hub id fetched into the local cache)."""
    p = Path(spec).expanduser()
    if p.is_dir():
        return p.resolve()
    if p.is_file() and gguf.gguf_file(p):  # GGUF: one file holds weights, tokenizer and chat template
        return p.resolve()
    if p.exists():
        raise KvauditError(f"checkpoint {spec} is a file, not a directory: pass the folder holding config.json, "
                           "or a .gguf file")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", spec) or spec.endswith((".json", ".safetensors", ".gguf")):
        raise KvauditError(
            f"checkpoint directory {spec} does not exist: pass --kvaudit-model=DIR or a hub id such as org/name"
        )
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(
            spec,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py", "*.tiktoken", "*.bin"],
        )
    except Exception as exc:  # network, auth, missing repo: all one line
        kind = type(exc).__name__
        raise KvauditError(
            f"cannot fetch hub model {spec!r} ({kind}): no network or no such repo; "
            "pass a local checkpoint directory with --kvaudit-model=DIR"
        ) from None
    return Path(local)


def weights_files(path: Path, allow_pickle: bool) -> list[Path]:
    safet = sorted(path.glob("*.safetensors"))
    if safet:
        return safet
    pickles = sorted([*path.glob("*.bin"), *path.glob("*.pt"), *path.glob("*.pth")])
    if pickles and not allow_pickle:
        raise KvauditError(
            f"checkpoint {path} has only pickle weights ({pickles[0].name}); kvaudit loads safetensors only: "
            "convert it (model.save_pretrained(dir, safe_serialization=True)) or pass --kvaudit-allow-pickle"
        )
    if pickles:
        return pickles
    raise KvauditError(f"checkpoint {path} holds no weight files (*.safetensors): is it a complete checkpoint?")


def file_digest(path: Path) -> str:
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


def read_config(path: Path) -> dict[str, Any]:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise KvauditError(f"checkpoint {path} has no config.json: pass the folder that save_pretrained wrote")
    cfg = read_json(cfg_path, "save_pretrained writes it; restore it from the original checkpoint")
    if not isinstance(cfg, dict):
        raise KvauditError(f"{cfg_path}: must hold a JSON object")
    return cfg


def model_identity(spec: str, path: Path, allow_pickle: bool = False) -> dict[str, Any]:
    """What makes a checkpoint itself: architecture, depth and a digest of its weight bytes."""
    if (g := gguf.gguf_file(path)) is not None:
        return gguf.identity(spec, g, file_digest(g))
    cfg = read_config(path)
    h = hashlib.sha256()
    for f in weights_files(path, allow_pickle):
        h.update(f.name.encode() + b"\0" + file_digest(f).encode())
    text_cfg = cfg.get("text_config") or {}
    layers = cfg.get("num_hidden_layers", cfg.get("n_layer", text_cfg.get("num_hidden_layers", 0)))
    return {
        "id": spec,
        "architecture": (cfg.get("architectures") or [cfg.get("model_type", "unknown")])[0],
        "model_type": cfg.get("model_type", "unknown"),
        "num_layers": int(layers or 0),
        "weights_digest": "sha256:" + h.hexdigest(),
        "config_digest": "sha256:" + hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest(),
    }


def load_tokenizer(path: Path, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    if (g := gguf.gguf_file(path)) is not None:
        return gguf.load_tokenizer(g)
    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise KvauditError(
                f"tokenizer of {path} needs custom code: pass --kvaudit-trust-remote-code if you trust it"
            ) from None
        raise KvauditError(f"cannot load the tokenizer of {path}: {str(exc).splitlines()[0]}") from None
    except OSError as exc:
        raise KvauditError(f"cannot load the tokenizer of {path}: {str(exc).splitlines()[0]}") from None


def load_model(path: Path, spec: OpenSpec, device: str) -> Any:
    """``spec``'s model from ``path`` (resolved) onto ``device`` (resolved)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress is kvaudit's to show, once per run, not per load
    dtype, attn, device_map = spec.dtype, spec.attn, spec.device_map
    trust_remote_code, allow_pickle = spec.trust_remote_code, spec.allow_pickle
    if (g := gguf.gguf_file(path)) is not None:
        return gguf.load_model(g, dtype, device, attn, device_map)
    cfg = read_config(path)
    if cfg.get("auto_map") and not trust_remote_code and not _known_model_type(cfg.get("model_type")):
        raise KvauditError(
            f"checkpoint {path} needs custom code (auto_map in config.json): pass --kvaudit-trust-remote-code if you "
            "trust it"
        )
    if cfg.get("is_encoder_decoder") or (cfg.get("text_config") or {}).get("is_encoder_decoder"):
        raise KvauditError(
            f"checkpoint {path} is an encoder-decoder model ({cfg.get('model_type', 'unknown')}): kvaudit audits "
            "decoder-only causal LMs, whose whole state is one K/V cache over the prefix; pass a causal LM"
        )
    weights_files(path, allow_pickle)
    kwargs: dict[str, Any] = {
        "dtype": torch_dtype(dtype),
        "trust_remote_code": trust_remote_code,
        "use_safetensors": not allow_pickle or bool(list(path.glob("*.safetensors"))),
        # load what does not fit, so that loading info names it, then refuse it below
        "ignore_mismatched_sizes": True,
        "output_loading_info": True,
    }
    if attn:
        kwargs["attn_implementation"] = attn
    if device_map:
        kwargs["device_map"] = device_map
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # transformers' load report would print; its findings are refused below
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
        model, info = loaded
    except (ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "trust_remote_code" in first:
            raise KvauditError(f"checkpoint {path} needs custom code: pass --kvaudit-trust-remote-code if you "
                               "trust it") from None
        raise KvauditError(f"cannot load {path} at {dtype}" + (f" with attention {attn!r}" if attn else "")
                           + f": {first}") from None
    except OSError as exc:
        raise KvauditError(f"cannot load {path}: {str(exc).strip().splitlines()[0]}") from None
    except Exception as exc:  # safetensors' and torch's own errors on files that check_files let through
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KvauditError(f"cannot load {path}: {type(exc).__name__}: {first[:300]}; "
                           "is the checkpoint complete?") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return ready(path, model, info, device, device_map)


def position_limit(model: Any) -> int | None:
    """The longest sequence the model's positions cover (max_position_embeddings or n_positions), if any."""
    cfg = model.config
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for c in (text, cfg):
        for attr in ("max_position_embeddings", "n_positions"):
            v = getattr(c, attr, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def _known_model_type(model_type: str | None) -> bool:
    if not model_type:
        return False
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    for src in (getattr(model, "generation_config", None), model.config):
        e = getattr(src, "eos_token_id", None) if src is not None else None
        if isinstance(e, int):
            ids.add(e)
        elif isinstance(e, (list, tuple)):
            ids.update(int(x) for x in e)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def open_model(spec: OpenSpec) -> ModelHandle:
    """Load ``spec.model`` at ``spec.dtype``: the one code path for the embedded checkpoint and any other."""
    path = resolve_checkpoint(spec.model, spec.trust_remote_code)
    check_files(path)
    identity = model_identity(spec.model, path, spec.allow_pickle)
    dev = resolve_device(spec.device)
    check_dtype_supported(spec.dtype, dev)
    tokenizer = load_tokenizer(path, spec.trust_remote_code)
    model = load_model(path, spec, dev)
    check_vocab(model, tokenizer, path)
    check_causal(model, path)
    impl = getattr(model.config, "_attn_implementation", None) or spec.attn or "default"
    return ModelHandle(
        model=model,
        tokenizer=tokenizer,
        dtype=spec.dtype,
        device=str(model.device) if spec.device_map else dev,
        attn_implementation=str(impl),
        identity=identity,
        eos_ids=eos_ids(model, tokenizer),
        vocab_size=int(model.get_input_embeddings().weight.shape[0]),
        max_positions=position_limit(model),
    )
