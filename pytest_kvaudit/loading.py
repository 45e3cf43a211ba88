"""Checkpoint + tokenizer -> a model handle with its identity, dtype, device and attention.

Safe by default: only safetensors weights are read and ``trust_remote_code`` stays off unless the
user opts in (``--kvaudit-allow-pickle``, ``--kvaudit-trust-remote-code``). Every failure is one
line naming the checkpoint and the fix.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import KvauditError

TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
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
    if p.exists():
        raise KvauditError(f"checkpoint {spec} is a file, not a directory: pass the folder holding config.json")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", spec) or spec.endswith((".json", ".safetensors")):
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


def model_identity(spec: str, path: Path, allow_pickle: bool = False) -> dict[str, Any]:
    """What makes a checkpoint itself: architecture, depth and a digest of its weight bytes."""
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


def resolve_device(spec: str) -> str:
    import torch

    if spec == "auto":
        if torch.cuda.is_available():
            return "cuda"
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise KvauditError(f"--kvaudit-device={spec} but torch sees no CUDA device: use --kvaudit-device=cpu or auto")
        idx = int(spec.split(":")[1]) if ":" in spec else 0
        if idx >= torch.cuda.device_count():
            raise KvauditError(
                f"--kvaudit-device={spec} but only {torch.cuda.device_count()} CUDA device(s) exist: use cuda:0..."
            )
    return spec


def check_dtype_supported(dtype: str, device: str) -> None:
    """Fail early, in one line, for a precision the device cannot run."""
    import torch

    tdt = getattr(torch, TORCH_DTYPES[dtype])
    if device.startswith("cuda") and dtype == "bf16" and not torch.cuda.is_bf16_supported():
        raise KvauditError(f"{torch.cuda.get_device_name(device)} does not support bf16: use --kvaudit-dtypes=fp16,fp32")
    try:
        a = torch.ones(4, 4, dtype=tdt, device=device)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as exc:
        raise KvauditError(f"device {device} cannot run {dtype} matmuls ({exc}); drop it from --kvaudit-dtypes") from None


def environment(device: str) -> dict[str, Any]:
    """The switches and versions that decide bit-exactness, recorded with every report and ledger."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        # the kind, not the index: cuda:0 and cuda:1 of one machine are one environment (the name says which GPU)
        "device": device.split(":")[0],
        "device_name": platform.processor() or platform.machine(),
        "cuda": torch.version.cuda,
        "num_threads": torch.get_num_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "tf32_matmul": bool(torch.backends.cuda.matmul.allow_tf32),
        "tf32_cudnn": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cpu_capability": _cpu_capability(),
        "cpu_isa": _cpu_isa(),
    }
    if device.startswith("cuda"):
        env["device_name"] = torch.cuda.get_device_name(device)
        env["sdpa_backends"] = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
    return env


def _cpu_isa() -> str:
    """The CPU extensions torch's kernels (oneDNN) may pick up beyond the dispatch level: AMX tiles and
    AVX512-BF16 change BF16 matmul bits on two CPUs that both report AVX512 (seen on this project's own
    ledger), so they are part of a ledger's identity."""
    import torch

    found = []
    for name in ("avx2", "avx512", "avx512_bf16", "vnni", "amx_tile", "amx_fp16"):
        probe = getattr(torch.cpu, f"_is_{name}_supported", None)
        try:
            if probe is not None and probe():
                found.append(name)
        except Exception:
            pass
    return "+".join(found) or "none"


def _cpu_capability() -> str:
    """The vector ISA torch's CPU kernels dispatch to (AVX2, AVX512, ...): it decides CPU bits."""
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        return "unknown"


def load_tokenizer(path: Path, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

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


def load_model(
    path: Path,
    dtype: str,
    device: str,
    attn: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    device_map: str | None = None,
) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # progress is kvaudit's to show, once per run, not per load
    cfg = read_config(path)
    if cfg.get("auto_map") and not trust_remote_code and not _known_model_type(cfg.get("model_type")):
        raise KvauditError(
            f"checkpoint {path} needs custom code (auto_map in config.json): pass --kvaudit-trust-remote-code if you trust it"
        )
    if cfg.get("is_encoder_decoder") or (cfg.get("text_config") or {}).get("is_encoder_decoder"):
        raise KvauditError(
            f"checkpoint {path} is an encoder-decoder model ({cfg.get('model_type', 'unknown')}): kvaudit audits "
            "decoder-only causal LMs, whose whole state is one K/V cache over the prefix; pass a causal LM"
        )
    weights_files(path, allow_pickle)
    kwargs: dict[str, Any] = {
        "dtype": getattr(torch, TORCH_DTYPES[dtype]),
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
            raise KvauditError(f"checkpoint {path} needs custom code: pass --kvaudit-trust-remote-code if you trust it") from None
        raise KvauditError(f"cannot load {path} at {dtype}" + (f" with attention {attn!r}" if attn else "") + f": {first}") from None
    except OSError as exc:
        raise KvauditError(f"cannot load {path}: {str(exc).strip().splitlines()[0]}") from None
    except Exception as exc:  # safetensors' and torch's own errors on files that check_files let through
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise KvauditError(f"cannot load {path}: {type(exc).__name__}: {first[:300]}; is the checkpoint complete?") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    check_loading_info(path, model, info)
    if not device_map:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


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
            "the config and the weights do not match (a config edited to fewer layers?); use the checkpoint's own config.json"
        )


#: how far (in the model dtype's epsilons, relative to the logits' scale) earlier positions may move when
#: the last token changes before the model counts as not causal; see :func:`check_causal`
CAUSAL_NOISE_EPS = 16


def check_causal(model: Any, path: Path) -> None:
    """Refuse a model whose earlier positions see later tokens (a bidirectional encoder).

    Change the last token of a short sequence: a causal model's logits at every earlier position stay
    bit-identical. Not all do bit for bit: a mixture-of-experts layer multiplies each expert's tokens as
    one matrix, and the changed token's routing changes those matrices' shapes and so the rounding of the
    others (a tiny Qwen2-MoE in fp32 on CPU moves by 7e-9). So when the bits differ, the model is refused
    only if earlier positions move by more than rounding could: ``CAUSAL_NOISE_EPS`` epsilons of the
    model's dtype, relative to the logits' scale. An encoder's earlier positions move by far more (a
    random-weight BERT in fp32: 2e-3 of the scale against a bound of 2e-6). In bf16 the bound is 1/8 of
    the scale: a weakly bidirectional model passes there, and is refused by the fp32 load of the same run.
    """
    import torch

    vocab = int(model.get_input_embeddings().weight.shape[0])
    if vocab < 2:
        return
    n = 6
    ids = torch.tensor([[(3 + 5 * i) % vocab for i in range(n)]], device=model.device)
    other = ids.clone()
    other[0, -1] = (int(ids[0, -1]) + 1) % vocab
    with torch.no_grad():
        a = model(input_ids=ids, use_cache=False).logits[:, :-1]
        b = model(input_ids=other, use_cache=False).logits[:, :-1]
    if torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)):
        return
    moved = float((a.float() - b.float()).abs().max())
    dtype = getattr(model, "dtype", a.dtype)
    eps = float(torch.finfo(dtype if dtype.is_floating_point else a.dtype).eps)
    bound = CAUSAL_NOISE_EPS * eps * max(float(a.float().abs().max()), 1e-30)
    if not moved <= bound:  # NaN moves too
        raise KvauditError(
            f"checkpoint {path} ({type(model).__name__}) is not causal: changing the last token moved the logits "
            f"at earlier positions by {moved:.3g} (rounding allows {bound:.3g}), so a prefix's state depends on what "
            "follows it; kvaudit audits causal decoder LMs only (a BERT-like encoder needs is_decoder=true)"
        )


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


def check_vocab(model: Any, tokenizer: Any, path: Path) -> None:
    n_model = model.get_input_embeddings().weight.shape[0]
    n_tok = len(tokenizer)
    if n_tok > n_model:
        raise KvauditError(
            f"tokenizer of {path} has {n_tok} tokens but the model's embedding has {n_model}: "
            "they come from different checkpoints"
        )


def open_model(
    spec: str,
    dtype: str,
    device: str = "auto",
    attn: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    device_map: str | None = None,
) -> ModelHandle:
    """Load ``spec`` at ``dtype``: the one code path for the embedded checkpoint and any other."""
    path = resolve_checkpoint(spec, trust_remote_code)
    check_files(path)
    identity = model_identity(spec, path, allow_pickle)
    dev = resolve_device(device)
    check_dtype_supported(dtype, dev)
    tokenizer = load_tokenizer(path, trust_remote_code)
    model = load_model(path, dtype, dev, attn, trust_remote_code, allow_pickle, device_map)
    check_vocab(model, tokenizer, path)
    check_causal(model, path)
    impl = getattr(model.config, "_attn_implementation", None) or attn or "default"
    return ModelHandle(
        model=model,
        tokenizer=tokenizer,
        dtype=dtype,
        device=str(model.device) if device_map else dev,
        attn_implementation=str(impl),
        identity=identity,
        eos_ids=eos_ids(model, tokenizer),
        vocab_size=int(model.get_input_embeddings().weight.shape[0]),
        max_positions=position_limit(model),
    )
