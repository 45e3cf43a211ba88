"""torch's process-wide settings for a run, set once before its store opens.

One CPU thread per process by default: the thread count changes the bits of CPU matmuls, and verdicts must
not depend on ``-n`` (``--kvaudit-threads`` trades that for speed). TF32 is set only when asked, and is
recorded in the environment block, so ledgers of the two settings differ. Under xdist, worker i takes GPU
i mod the GPU count when the device is ``auto``.
"""

from __future__ import annotations

from pytest_kvaudit.core.model.config import AuditConfig


def prepare(cfg: AuditConfig, worker: int | None = None) -> AuditConfig:
    """Set torch up for ``cfg`` in this process; returns the config with this worker's device."""
    import torch

    torch.set_num_threads(cfg.threads or 1)
    if cfg.tf32 is not None:
        torch.backends.cuda.matmul.allow_tf32 = cfg.tf32
        torch.backends.cudnn.allow_tf32 = cfg.tf32
    if worker is not None and cfg.device == "auto" and cfg.device_map is None and torch.cuda.is_available():
        cfg = cfg.replace(device=f"cuda:{max(0, worker) % torch.cuda.device_count()}")
    return cfg
