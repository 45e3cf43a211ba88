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
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise KvauditError(f"{cfg_path}: not valid JSON ({exc.msg})") from None
    if not isinstance(cfg, dict):
        raise KvauditError(f"{cfg_path}: must hold a JSON object")
    return cfg


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
    weights_files(path, allow_pickle)
    kwargs: dict[str, Any] = {
        "dtype": getattr(torch, TORCH_DTYPES[dtype]),
        "trust_remote_code": trust_remote_code,
        "use_safetensors": not allow_pickle or bool(list(path.glob("*.safetensors"))),
    }
    if attn:
        kwargs["attn_implementation"] = attn
    if device_map:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    except (ValueError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "trust_remote_code" in first:
            raise KvauditError(f"checkpoint {path} needs custom code: pass --kvaudit-trust-remote-code if you trust it") from None
        raise KvauditError(f"cannot load {path} at {dtype}" + (f" with attention {attn!r}" if attn else "") + f": {first}") from None
    except OSError as exc:
        raise KvauditError(f"cannot load {path}: {str(exc).strip().splitlines()[0]}") from None
    if not device_map:
        model.to(device)  # type: ignore[arg-type]
    model.eval()
    model.requires_grad_(False)
    return model


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
    identity = model_identity(spec, path, allow_pickle)
    dev = resolve_device(device)
    check_dtype_supported(dtype, dev)
    tokenizer = load_tokenizer(path, trust_remote_code)
    model = load_model(path, dtype, dev, attn, trust_remote_code, allow_pickle, device_map)
    check_vocab(model, tokenizer, path)
    impl = getattr(model.config, "_attn_implementation", None) or attn or "default"
    return ModelHandle(
        model=model,
        tokenizer=tokenizer,
        dtype=dtype,
        device=str(model.device) if device_map else dev,
        attn_implementation=str(impl),
        identity=identity,
        eos_ids=eos_ids(model, tokenizer),
    )
