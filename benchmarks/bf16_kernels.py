"""What a CPU without BF16 in hardware costs: one checkpoint's prefill and decode steps at FP32 and BF16, timed with
torch's own kernels as this CPU has them and held to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``,
set before torch loads, in a child process each), side by side in one run, one thread.

CI runs on CPUs that differ (AMX, AVX512-BF16, AVX2): this says which of the suite's tests the AVX2 one pays for
(the real model's BF16 work), and is how docs/contributing.md's "under AVX2 kernels" figures were taken.

    python benchmarks/bf16_kernels.py CHECKPOINT [OUT.json]    # CHECKPOINT: e.g. what scripts/smollm2.py prints
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

PROMPT, STEPS, REPEATS = 200, 40, 3
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def child(path: str) -> dict[str, dict[str, float]]:
    """Median seconds of a PROMPT-token prefill and of one decode step, per precision, in this process."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    out: dict[str, dict[str, float]] = {"capability": torch.backends.cpu.get_cpu_capability()}  # type: ignore[dict-item]
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
        ids = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(0))
        prefill, decode = [], []
        with torch.no_grad():
            model(ids[:, :8])  # one untimed forward: one-time kernel set-up
            for _ in range(REPEATS):
                t = time.perf_counter()
                cache = model(ids, use_cache=True).past_key_values
                prefill.append(time.perf_counter() - t)
                nxt = ids[:, -1:]
                t = time.perf_counter()
                for _ in range(STEPS):
                    cache = model(nxt, past_key_values=cache, use_cache=True).past_key_values
                decode.append((time.perf_counter() - t) / STEPS)
        out[name] = {"prefill_s": statistics.median(prefill), "decode_step_s": statistics.median(decode)}
    return out


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2])))
        return 0
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    path = sys.argv[1]
    rows = {}
    for label, extra in (("native", {}), ("avx2", AVX2)):
        env = {k: v for k, v in os.environ.items() if k not in AVX2} | extra
        res = subprocess.run([sys.executable, __file__, "--child", path], env=env, capture_output=True, text=True,
                             check=True)
        rows[label] = json.loads(res.stdout.strip().splitlines()[-1])
    print(f"{PROMPT}-token prefill and one decode step, median of {REPEATS}, one thread: {path}")
    print(f"{'kernels':28} {'fp32 prefill':>13} {'bf16 prefill':>13} {'fp32 step':>10} {'bf16 step':>10}")
    for label, r in rows.items():
        name = f"{label} ({r['capability']})"
        print(f"{name:28} {r['fp32']['prefill_s'] * 1e3:10.0f} ms {r['bf16']['prefill_s'] * 1e3:10.0f} ms "
              f"{r['fp32']['decode_step_s'] * 1e3:7.1f} ms {r['bf16']['decode_step_s'] * 1e3:7.1f} ms")
    n, a = rows["native"], rows["avx2"]
    print(f"avx2 / native: fp32 prefill {a['fp32']['prefill_s'] / n['fp32']['prefill_s']:.2f}x, bf16 prefill "
          f"{a['bf16']['prefill_s'] / n['bf16']['prefill_s']:.2f}x, fp32 step "
          f"{a['fp32']['decode_step_s'] / n['fp32']['decode_step_s']:.2f}x, bf16 step "
          f"{a['bf16']['decode_step_s'] / n['bf16']['decode_step_s']:.2f}x")
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump({"checkpoint": path, "prompt": PROMPT, "steps": STEPS, "repeats": REPEATS, **rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
