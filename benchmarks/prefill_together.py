"""What prefilling waiting prompts together would save: R prompts of P tokens each prefilled in R
passes of one row (what the batch engine does: engine/batch/prefill.py) against one pass of R rows
(what mlx-lm's BatchGenerator does, padded to the longest), on the accelerator proxy (an 8B
model's 32 layers at hidden 128: a pass's fixed work weighs as on a GPU) or a model folder.

    OPENBLAS_NUM_THREADS=1 LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 \\
        python benchmarks/prefill_together.py [--model proxy|DIR] [--rounds 5]

Prints, per (P, R), the median seconds of each way over alternating rounds and their ratio.
"""

import argparse
import statistics
import time

import mlx.core as mx
from accelerator import build
from mlx_lm.models.cache import make_prompt_cache

import specgen


def separately(model, rows: int, length: int) -> None:
    for r in range(rows):
        mx.eval(model(mx.arange(length)[None] + r, cache=make_prompt_cache(model)))


def together(model, rows: int, length: int) -> None:
    mx.eval(model(mx.arange(length)[None] + mx.arange(rows)[:, None], cache=make_prompt_cache(model)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="proxy")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    model = build("proxy", "float32", 49152).model if a.model == "proxy" else specgen.load(a.model)[0]
    for length in (32, 100, 250):
        for rows in (4, 8):
            times = {f: [] for f in (separately, together)}
            for f in times:  # warm-up
                f(model, rows, length)
            for _ in range(a.rounds):
                for f, seen in times.items():
                    t = time.perf_counter()
                    f(model, rows, length)
                    seen.append(time.perf_counter() - t)
            apart, joint = (statistics.median(times[f]) for f in (separately, together))
            print(f"{rows} prompts of {length} tokens: separately {apart * 1000:.0f} ms, together "
                  f"{joint * 1000:.0f} ms, {apart / joint:.2f}x")


if __name__ == "__main__":
    main()
