"""GGUF checkpoints: one ``.gguf`` file, read through transformers' GGUF support and dequantized.

Many small checkpoints circulate only as GGUF (llama.cpp's format: weights, tokenizer and chat template in
one file). The audit runs them as what they are once dequantized: a plain transformers model whose
weights are cast to each audited precision, so a bf16 unit computes in bf16 like any other checkpoint's.
The identity says so (``identity["gguf"]``: the file, its quantization type, ``dequantized``), and its
digest covers the file's bytes, so a ledger recorded on a Q4_1 file is never compared with a Q8_0 one.

The dependencies (``gguf``, ``accelerate``) are the ``pytest-kvaudit[gguf]`` extra: their absence is
one line naming it, raised before anything is loaded. Nothing here imports torch or transformers at import.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.errors import KvauditError
from pytest_kvaudit.core.runtime.environment import torch_dtype
from pytest_kvaudit.core.runtime.refusals import ready

SUFFIX = ".gguf"
#: the packages the ``pytest-kvaudit[gguf]`` extra installs: transformers needs both to read a GGUF file
EXTRA = ("gguf", "accelerate")
#: tensor types that hold plain floats: a file of only these was not quantized
_FLOAT_TYPES = frozenset({"F32", "F16", "BF16", "F64"})


def gguf_file(path: Path) -> Path | None:
    """The GGUF file a resolved checkpoint names, or None for an ordinary checkpoint folder.

    ``path`` is the file itself, or a folder holding exactly one ``.gguf`` and no ``config.json`` (a folder
    with a config.json is a transformers checkpoint, whatever else lies beside it).
    """
    if path.is_file():
        return path if path.suffix.lower() == SUFFIX else None
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) > 1:
        names = ", ".join(p.name for p in found[:3])
        raise KvauditError(f"checkpoint {path} holds {len(found)} GGUF files ({names}): pass one as "
                           "--kvaudit-model=FILE.gguf")
    return found[0] if found else None


def require_extra(file: Path) -> None:
    """The ``[gguf]`` extra is installed, or one line saying how to install it."""
    missing = [m for m in EXTRA if importlib.util.find_spec(m) is None]
    if missing:
        raise KvauditError(
            f"checkpoint {file} is a GGUF file: install pytest-kvaudit[gguf] (gguf and accelerate) to load it "
            f"(missing: {', '.join(missing)})"
        )


def read_header(file: Path) -> dict[str, Any]:
    """The file's scalar metadata and the count of its tensors per ggml type (the ``gguf`` package, no torch)."""
    require_extra(file)
    from gguf import GGUFReader  # the extra: imported where a GGUF file is actually read

    try:
        reader = GGUFReader(str(file))
    except Exception as exc:  # a truncated or foreign file: gguf's own errors are ValueErrors and struct errors
        raise KvauditError(f"{file} is not a readable GGUF file ({type(exc).__name__}: {str(exc)[:200]}); "
                           "re-download it") from None
    meta = {k: f.contents() for k, f in reader.fields.items() if len(f.data) == 1
            and not k.startswith("tokenizer.ggml.")}
    types = Counter(t.tensor_type.name for t in reader.tensors)
    return {"metadata": meta, "tensor_types": dict(sorted(types.items()))}


def quantization(header: dict[str, Any]) -> str:
    """The file's quantization as llama.cpp names it (``Q4_1``): its declared file type, else the commonest
    block type among its tensors (a few tensors, e.g. norms or the embedding, usually keep another type)."""
    from gguf import LlamaFileType

    ftype = header["metadata"].get("general.file_type")
    if isinstance(ftype, int):
        try:
            return LlamaFileType(ftype).name.removeprefix("MOSTLY_")
        except ValueError:
            pass
    counts: dict[str, int] = header["tensor_types"]
    blocks = {k: v for k, v in counts.items() if k not in _FLOAT_TYPES}
    return max(blocks, key=lambda k: blocks[k]) if blocks else max(counts, key=lambda k: counts[k], default="unknown")


def identity(spec: str, file: Path, digest: str) -> dict[str, Any]:
    """The checkpoint's identity, as :func:`loading.model_identity` gives a folder's: the digest is the file's
    sha256 (``digest``, computed and cached by the caller), the config digest covers the scalar metadata."""
    header = read_header(file)
    meta = header["metadata"]
    arch = str(meta.get("general.architecture", "unknown"))
    return {
        "id": spec,
        "architecture": _causal_lm_class(arch),
        "model_type": arch,
        "num_layers": int(meta.get(f"{arch}.block_count", 0) or 0),
        "weights_digest": "sha256:" + hashlib.sha256(file.name.encode() + b"\0" + digest.encode()).hexdigest(),
        "config_digest": "sha256:" + hashlib.sha256(json.dumps(meta, sort_keys=True, default=str).encode()).hexdigest(),
        "gguf": {"file": file.name, "quantization": quantization(header), "tensor_types": header["tensor_types"],
                 "dequantized": True},
    }


def _causal_lm_class(arch: str) -> str:
    """transformers' causal-LM class for a GGUF architecture name, as a folder's config.json would name it."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return str(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(arch, arch))


def load_tokenizer(file: Path) -> Any:
    """The tokenizer and chat template stored in the file."""
    require_extra(file)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    except (ValueError, OSError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KvauditError(f"cannot load the tokenizer of {file}: {first[:300]}") from None


def load_model(file: Path, dtype: str, device: str, attn: str | None = None, device_map: str | None = None) -> Any:
    """The model, every weight dequantized and cast to ``dtype``.

    ``dequantize=True`` is asked for explicitly: transformers may otherwise keep the blocks packed and
    compute matmuls in float32 whatever dtype was asked for, and a bf16 audit would not be one.
    """
    require_extra(file)
    from transformers import AutoModelForCausalLM, GgufConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kwargs: dict[str, Any] = {"gguf_file": file.name, "dtype": torch_dtype(dtype),
                              "quantization_config": GgufConfig(dequantize=True), "output_loading_info": True}
    if attn:
        kwargs["attn_implementation"] = attn
    if device_map:
        kwargs["device_map"] = device_map
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(str(file.parent), **kwargs)
        model, info = loaded
    except (ValueError, ImportError, OSError, RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise KvauditError(f"cannot load GGUF file {file} at {dtype}: {first[:300]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return ready(file, model, info, device, device_map)


def convert(file: Path, out: Path, dtype: str = "fp32") -> Path:
    """Write ``file`` dequantized as an ordinary safetensors checkpoint (config, weights at ``dtype``,
    tokenizer with its chat template) into the new folder ``out``; return ``out``.

    transformers refuses to save a model "quantized with gguf" even once every weight is dense: its
    quantizer and ``quantization_config`` are dropped first, which is what makes the folder plain.
    """
    model = load_model(file, dtype, "cpu")
    tokenizer = load_tokenizer(file)
    model.hf_quantizer = None
    model.is_quantized = False
    for cfg in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
    out.mkdir(parents=True, exist_ok=False)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
