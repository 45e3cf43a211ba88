"""Tiny random checkpoints for self-tests and for users who test their own claims.

``tiny_checkpoint(dir, "llama")`` writes a randomly initialised causal LM of the given architecture,
a character-level tokenizer that ``AutoTokenizer`` loads offline, and an item set, all with the same
``save_pretrained`` files a real checkpoint has, so the suite runs on it through the ordinary path.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def tiny_checkpoint(out: Path | str, arch: str = "llama", seed: int = 0, layers: int = 2, hidden: int = 32,
                    n_items: int = 16, boundary: str = "tokens:4", max_new_tokens: int = 24,
                    safetensors: bool = True, chat_template: bool = False) -> Path:
    """Write a random ``arch`` checkpoint with tokenizer and items to ``out``; return ``out``.

    ``chat_template`` gives the tokenizer ``CHAR_CHAT_TEMPLATE`` (without it the tokenizer has none).
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cls_name, extra = ARCHITECTURES[arch]
    cfg_cls = getattr(transformers, cls_name)
    v = char_vocab()
    common: dict[str, Any] = {"vocab_size": len(v), "pad_token_id": v["<pad>"], "eos_token_id": v["<eos>"],
                              "bos_token_id": v["<eos>"]}
    if arch == "gpt2":
        kw = {"n_embd": hidden, "n_layer": layers, "n_head": 4, "n_positions": 128}
    elif arch == "mamba":
        kw = {"hidden_size": hidden, "num_hidden_layers": layers}
    else:
        kw = {"hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}
    cfg = cfg_cls(**common, **kw, **extra)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(str(out))
    if not safetensors:  # an old-style pickle checkpoint (transformers 5 writes safetensors only)
        for f in out.glob("*.safetensors"):
            f.unlink()
        torch.save(model.state_dict(), out / "pytorch_model.bin")
    save_char_tokenizer(out, chat_template)
    write_items(out, n_items, boundary, max_new_tokens)
    return out
