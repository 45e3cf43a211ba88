"""Torch and the engines: loading checkpoints (safetensors and GGUF), chat templates, the decoder, the cache
state adapters (:mod:`.state`) and the backends (:mod:`.backends`). Imported only when a run computes."""
