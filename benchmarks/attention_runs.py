"""What a cut costs and saves in attention by runs (engine/batch/attend.py): the evidence for
`GROUP`, the row-slots one more attention call must save.

One decoding pass of B rows over S cache slots, through the model's own layers with specgen's
wrapper installed, timed three ways (medians over rounds): every row over all S slots in one call;
the same keys in two calls of B/2 rows (what a call costs); one call over the last S/2 slots (what
a row-slot costs). Prints one JSON line with the break-even: row-slots a cut must save to pay.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/attention_runs.py \\
        [--model DIR | --shape 8b --dtype 4bit] [--rows 2 8] [--slots 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache

sys.path.insert(0, str(Path(__file__).parent))
from serve import float32_model  # noqa: E402

from specgen.engine.batch.attend import Run, install  # noqa: E402


class Planned(KVCache):
    """mlx-lm's KV cache with a ragged layer's two extras: an array mask and the step's runs."""

    runs: list[Run] | None = None

    def make_mask(self, n: int, return_array: bool = False, window_size=None):
        return mx.ones((self.keys.shape[0], 1, n, self.offset + n), dtype=mx.bool_)


def timed(model, rows: int, slots: int, plan: list[Run], rounds: int) -> float:
    """Median seconds of a one-position pass over `rows` rows of `slots` random keys, by `plan`."""
    probe = [KVCache() for _ in model.layers]
    model(mx.zeros((1, 1), dtype=mx.int32), cache=probe)  # the shape and dtype of its keys
    _, heads, _, dim = probe[0].keys.shape
    cache = [Planned() for _ in model.layers]
    for c in cache:
        kv = mx.random.normal((rows, heads, slots, dim)).astype(probe[0].keys.dtype)
        c.update_and_fetch(kv, kv)
        c.runs = plan
    mx.eval([c.state for c in cache])
    x, seconds = mx.zeros((rows, 1), dtype=mx.int32), []
    for _ in range(rounds):
        t = time.perf_counter()
        mx.eval(model(x, cache=cache).argmax(-1))
        seconds.append(time.perf_counter() - t)
        for c in cache:
            c.trim(1)
    return statistics.median(seconds)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a model folder (default: the shared SmolLM2 in float32)")
    ap.add_argument("--shape", help="instead, accelerator.py's random Llama-3-8B shape (8b or proxy)")
    ap.add_argument("--dtype", default="4bit", help="with --shape")
    ap.add_argument("--rows", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--slots", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    if args.shape:
        from accelerator import build
        model = build(args.shape, args.dtype, 32000).model
    else:
        import specgen
        model, _ = specgen.load(args.model or float32_model())
    install(model)
    for rows in args.rows:
        s = args.slots
        one = timed(model, rows, s, [Run(0, rows, 0)], args.rounds)
        two = timed(model, rows, s, [Run(0, rows // 2, 0), Run(rows // 2, rows, 0)], args.rounds)
        half = timed(model, rows, s, [Run(0, rows, s // 2)], args.rounds)
        call, slot = two - one, (one - half) / (rows * (s // 2))
        print(json.dumps({"rows": rows, "slots": s, "pass_ms": round(one * 1e3, 2),
                          "call_ms": round(call * 1e3, 3), "row_slot_us": round(slot * 1e6, 4),
                          "break_even_row_slots": round(call / slot) if slot > 0 else None}), flush=True)


if __name__ == "__main__":
    main()
