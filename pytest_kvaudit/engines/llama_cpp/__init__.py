"""The llama.cpp engine: a GGUF file run natively by llama-cpp-python (:mod:`.backend`, its tokenizer in
:mod:`.tokens`), declared by its record (:mod:`.record`)."""
