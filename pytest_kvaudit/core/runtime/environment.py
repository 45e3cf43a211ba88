"""Where a run computes: the device it resolves to, whether that device can run a precision, and the
switches and versions that decide bit-exactness (recorded with every report and ledger)."""

from __future__ import annotations

import os
import platform
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.model.precisions import named, torch_precisions


def torch_dtype(dtype: str) -> Any:
    """The torch dtype that precision ``dtype`` runs in (:mod:`pytest_kvaudit.core.model.precisions`)."""
    import torch

    check_torch_precision(dtype)
    return getattr(torch, str(named(dtype).torch))


def check_torch_precision(dtype: str) -> None:
    """One line for a K/V cache type (``q8_0``) asked of an engine that runs torch dtypes."""
    if named(dtype).torch is None:
        raise KvauditError(f"--kvaudit-dtypes={dtype} is a K/V cache type of --kvaudit-backend=llama.cpp, not a "
                           f"precision transformers runs: use {', '.join(torch_precisions())}")


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
            raise KvauditError(f"--kvaudit-device={spec} but torch sees no CUDA device: use --kvaudit-device=cpu or "
                               "auto")
        idx = int(spec.split(":")[1]) if ":" in spec else 0
        if idx >= torch.cuda.device_count():
            raise KvauditError(
                f"--kvaudit-device={spec} but only {torch.cuda.device_count()} CUDA device(s) exist: use cuda:0..."
            )
    return spec


def check_dtype_supported(dtype: str, device: str) -> None:
    """Fail early, in one line, for a precision the device cannot run."""
    import torch

    tdt = torch_dtype(dtype)
    if device.startswith("cuda") and dtype == "bf16" and not torch.cuda.is_bf16_supported():
        raise KvauditError(f"{torch.cuda.get_device_name(device)} does not support bf16: "
                           "use --kvaudit-dtypes=fp16,fp32")
    try:
        a = torch.ones(4, 4, dtype=tdt, device=device)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as exc:
        raise KvauditError(f"device {device} cannot run {dtype} matmuls ({exc}); "
                           "drop it from --kvaudit-dtypes") from None


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
