"""Where a plain batched decoding step's time goes: R rows of one query each over their caches (as
`mlx_lm.batch_generate` and specgen's batch engine both step at 32 rows, where no row drafts on
this CPU), against one row fed R positions (the same matrix products), each with the model's
attention and with it skipped (`skip`): what is left is the matrix products.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libopenblas.so.0 python benchmarks/step_parts.py \\
        [--model DIR] [--rows 32] [--rounds 7]

The default model is the shared SmolLM2 in float32 (serve.py makes it once). Prints the median
milliseconds of each pass over `--rounds` timings after a warm-up.
"""

import argparse
import importlib
import random
import statistics
import time

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import BatchKVCache, make_prompt_cache
from serve import float32_model


def timed(step, rounds: int) -> float:
    step()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def skip(queries, keys, values, *args, **kwargs):
    """Attention skipped: the layer's queries handed back, its keys and values still made and
    stored (a pass that read none of them would not compute them)."""
    return queries + 0 * (keys[..., :1, :1].sum() + values[..., :1, :1].sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model folder (default: the shared SmolLM2 in float32)")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    model, _ = load(args.model or float32_model())
    rng = random.Random(0)
    # Contexts as --batch 32's rows hold mid-answer: a ~60-250-token prompt and part of its answer.
    lengths = [rng.randint(100, 350) for _ in range(args.rows)]
    pads = [max(lengths) - n for n in lengths]
    prompts = mx.array([[0] * p + [rng.randint(100, 30000) for _ in range(n)] for p, n in zip(pads, lengths)])
    rows = [BatchKVCache(pads) for _ in model.layers]
    mx.eval(model(prompts, cache=rows), [c.state for c in rows])
    one = make_prompt_cache(model)
    mx.eval(model(prompts[:1, pads[0]:], cache=one))

    def batched():  # one query a row; the cache is put back so that every timing sees the same
        mx.eval(mx.argmax(model(mx.ones((args.rows, 1), mx.uint32), cache=rows)[:, -1], axis=-1))
        for c in rows:
            c.offset -= 1
            c._idx -= 1

    def single():
        mx.eval(mx.argmax(model(mx.ones((1, args.rows), mx.uint32), cache=one)[:, -1], axis=-1))
        for c in one:
            c.trim(args.rows)

    module = importlib.import_module(type(model).__module__)
    attention = module.scaled_dot_product_attention
    figures = {}
    for skipped in (False, True):
        if skipped:
            module.scaled_dot_product_attention = skip
        figures[skipped] = timed(batched, args.rounds), timed(single, args.rounds)
        module.scaled_dot_product_attention = attention
    (b, s), (b0, s0) = figures[False], figures[True]
    print(f"{args.rows} rows, one query each, over {min(lengths)}-{max(lengths)} slots: {b:.1f} ms "
          f"(attention {b - b0:.1f} ms, {100 * (b - b0) / b:.0f}%; the rest {b0:.1f} ms)")
    print(f"one row fed {args.rows} positions: {s:.1f} ms (attention {s - s0:.1f} ms; the rest {s0:.1f} ms)")


if __name__ == "__main__":
    main()
