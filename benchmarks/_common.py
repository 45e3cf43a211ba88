"""Shared plumbing for the benchmark scripts: flags, thread setup, tables, JSON output, random models.

Why a helper module and not a dependency: the benchmarks are plain scripts that run from a source
checkout (``python benchmarks/x.py``) with nothing beyond the project's own venv, so their common
parts live next to them. Nothing here measures anything; it only sets up and prints.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run from a checkout without an install: import the working tree
    sys.path.insert(0, str(REPO))

#: random Llama shapes (``AutoModelForCausalLM.from_config``): name -> LlamaConfig kwargs
LLAMA_PRESETS: dict[str, dict[str, int]] = {
    # ~110M parameters (tied embeddings): GPT-2-small-sized, runs a few dozen tokens a second on one CPU thread
    "100m": {"hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
             "num_key_value_heads": 4, "vocab_size": 32000},
    # ~1.1B parameters (TinyLlama's shape): the GPU runner's model
    "1b": {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32,
           "num_key_value_heads": 4, "vocab_size": 32000},
    # a few M parameters: smoke-tests the GPU script's code paths on a CPU
    "smoke": {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000},
}


def parser(description: str) -> argparse.ArgumentParser:
    """An argument parser with the flags every benchmark takes (--out, --threads, --device)."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default=None, help="also write the results as JSON to this path (default: print only)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (kvaudit runs 1 thread per process, so 1 is the default)")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    return p


def setup_torch(threads: int) -> str:
    """Set the torch CPU thread count (kvaudit's default is 1 per process) and say so."""
    import torch

    torch.set_num_threads(threads)
    line = (f"torch.set_num_threads({threads}) (kvaudit runs 1 thread per process); torch {torch.__version__}, "
            f"{os.cpu_count()} CPU cores, load average {os.getloadavg()[0]:.2f} at start")
    print(line, flush=True)
    return line


def environment(device: str) -> dict[str, Any]:
    """What the figures were measured on: versions, threads, device, load (to judge contention)."""
    import torch
    import transformers

    env: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "device": device,
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["cuda_device"] = torch.cuda.get_device_name(torch.device(device))
    return env


def sync(device: str) -> None:
    """Wait for queued device work, so a wall-clock timer measures the work and not its launch."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[float, Any]:
    """Seconds one call of ``fn`` takes (device synchronised on both sides) and its result."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        a = abs(v)
        if a == 0:
            return "0"
        if a >= 1000:
            return f"{v:,.0f}"
        if a >= 100:
            return f"{v:.1f}"
        if a >= 1:
            return f"{v:.3f}"
        return f"{v:.4f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table (first column left-aligned, the rest right-aligned), printed and returned."""
    cells = [[fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]

    def line(vals: Sequence[str]) -> str:
        return "  ".join(v.ljust(widths[i]) if i == 0 else v.rjust(widths[i]) for i, v in enumerate(vals))

    out = [title, line(headers), "  ".join("-" * w for w in widths), *(line(r) for r in cells)]
    text = "\n".join(out)
    print(text + "\n", flush=True)
    return text


def target_line(name: str, measured: float, op: str, target: float, unit: str = "") -> tuple[str, bool]:
    """``TARGET MET/MISSED`` with the measured figure: a missed target is reported, never adjusted."""
    ok = measured <= target if op == "<=" else measured >= target
    line = f"target {name} {op} {target:g}{unit}: {'MET' if ok else 'MISSED'} (measured {measured:.4g}{unit})"
    print(line, flush=True)
    return line, ok


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` (nothing when no --out was given)."""
    if not path:
        return
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"results written to {p}", flush=True)


def config_extras(sweep_units: int | None) -> dict[str, Any]:
    """``AuditConfig`` fields a flag sets only where this kvaudit version has them (``sweep_units``)."""
    import dataclasses

    from pytest_kvaudit.core.model.config import AuditConfig

    names = {f.name for f in dataclasses.fields(AuditConfig)}
    out: dict[str, Any] = {}
    if sweep_units is not None:
        if "sweep_units" not in names:
            print("note: --sweep-units ignored: this kvaudit's AuditConfig has no layer sweep", flush=True)
        else:
            out["sweep_units"] = sweep_units
    return out


def random_llama(preset: str, device: str, dtype: str = "fp32", vocab_size: int | None = None, seed: int = 0) -> Any:
    """A randomly initialised Llama of ``preset``'s shape, built with ``AutoModelForCausalLM.from_config``."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    kw: dict[str, Any] = dict(LLAMA_PRESETS[preset])
    if vocab_size is not None:
        kw["vocab_size"] = vocab_size
    cfg = LlamaConfig(**kw, max_position_embeddings=2048, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    with torch.device(device):  # initialise on the device: a 1B init on one CPU thread takes a minute
        model = AutoModelForCausalLM.from_config(cfg, dtype=tdt)
    model.eval()
    model.requires_grad_(False)
    return model


def n_params(model: Any) -> int:
    return sum(p.numel() for p in model.parameters())


def random_llama_checkpoint(out: Path | str, preset: str, device: str, n_items: int = 16,
                            boundary: str = "tokens:4", max_new_tokens: int = 24) -> Path:
    """A ``save_pretrained`` checkpoint of a random ``preset`` Llama with kvaudit's char tokenizer and items.

    Why: the store only runs on a checkpoint folder (weights + tokenizer + items), so benchmarks of the
    store on a big model need one on disk. The vocabulary is the char tokenizer's (19 tokens), so the
    parameter count is the body's (about 1.0B for the ``1b`` preset). Saved in bf16 to halve the write.
    """
    import torch

    from pytest_kvaudit.testing import char_vocab, save_char_tokenizer, write_items

    out = Path(out)
    if (out / "config.json").is_file() and (out / "items.jsonl").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model = random_llama(preset, device, "fp32", vocab_size=len(char_vocab()))
    model.to(torch.bfloat16).save_pretrained(str(out))
    save_char_tokenizer(out)
    write_items(out, n_items, boundary, max_new_tokens)
    del model
    return out


if __name__ == "__main__":  # gpu.sh: write the random-Llama checkpoint once for the store benchmarks
    ap = argparse.ArgumentParser(description="write a random Llama checkpoint for the store benchmarks")
    ap.add_argument("out")
    ap.add_argument("--preset", default="1b", choices=sorted(LLAMA_PRESETS))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--n-items", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    a = ap.parse_args()
    t0 = time.perf_counter()
    path = random_llama_checkpoint(a.out, a.preset, a.device, a.n_items, "tokens:4", a.max_new_tokens)
    print(f"random {a.preset} Llama checkpoint at {path} ({time.perf_counter() - t0:.1f}s)")
