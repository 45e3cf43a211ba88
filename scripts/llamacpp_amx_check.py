"""Does llama.cpp's AMX int8 path run on this machine? One Q4_1 GGUF, a 3-token and a 1-token decode, with the
model's extra buffer types (AMX, repack) on or off.

    python scripts/llamacpp_amx_check.py FILE.gguf 1    # use_extra_bufts on (llama.cpp's default)
    python scripts/llamacpp_amx_check.py FILE.gguf 0    # off: plain CPU buffers, ggml's own kernels

Seen with llama-cpp-python 0.3.36 built by GCC 12.2 on an Intel Xeon with AMX: "on" dies with SIGSEGV (a general
protection fault at ``ldtilecfg`` in ``ggml_backend_amx_mul_mat``, the first batch of 2+ tokens), "off" runs.
"""

import sys

import llama_cpp
import llama_cpp.llama_cpp as lc

path, extra = sys.argv[1], sys.argv[2] == "1"
default = lc.llama_model_default_params


def params():  # Llama() has no use_extra_bufts argument: it reads the defaults from this function
    p = default()
    p.use_extra_bufts = extra
    return p


lc.llama_model_default_params = params
llm = llama_cpp.Llama(path, n_ctx=256, n_threads=1, n_threads_batch=1, type_k=0, type_v=0, verbose=False)
llm.eval([1, 2, 3])
llm.eval([4])
print("ok", path.split("/")[-1], "use_extra_bufts", extra)
